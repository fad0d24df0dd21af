"""`bench --tool perf_analyzer|genai-perf|aiperf`: run NVIDIA's tool on our workload, import its export, write
our summary format (summary.json / summary.csv / requests.jsonl per point, sweep.json) so `bench compare`
shows forge and the tool side by side.

The workload is ours exactly: the same seeded prompts and output lengths as `bench` with the same options
(`run.build_requests`), the same inputs per request (the target's `request_inputs`, read from the model's
config), streaming over gRPC. Each tool run has its own log; a run that fails keeps its log and exits 1.
perf_analyzer 2.51 has no warm-up option: warm-up requests go in a separate, unexported PA run first.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

from trtllm_forge import third_party_env
from trtllm_forge.bench import report
from trtllm_forge.bench.exports import import_export
from trtllm_forge.bench.interop import (
    ToolWorkload,
    aiperf_argv,
    emit,
    genai_perf_argv,
    perf_analyzer_argv,
    write_aiperf_inputs,
    write_perf_analyzer_inputs,
    write_prompts_jsonl,
)
from trtllm_forge.bench.runner import LoadSpec
from trtllm_forge.bench.target import output_length_plan
from trtllm_forge.bench.workload import load_tokenizer
from trtllm_forge.errors import ConfigError, StepError
from trtllm_forge.ui import info, warn

TOOLS = ("perf_analyzer", "genai-perf", "aiperf")
GRPC_TARGETS = ("triton-grpc", "triton-grpc-tokens")
TOOL_TARGETS = {"perf_analyzer": GRPC_TARGETS, "genai-perf": ("triton-grpc",), "aiperf": ("triton-http",)}  # what each can drive
TOOL_ENV = {"genai-perf": "FORGE_GENAI_PERF", "aiperf": "FORGE_AIPERF"}  # path of the tool's executable
# What the rendered ensemble / tensorrt_llm model declare: the inputs --emit assumes when no server answers.
ASSUMED_INPUTS = {
    "triton-grpc": (
        {"text_input", "max_tokens", "stream", "exclude_input_in_output", "min_tokens", "end_id", "return_num_output_tokens"},
        {"text_output", "num_output_tokens"},
    ),
    "triton-grpc-tokens": (
        {"input_ids", "input_lengths", "request_output_len", "streaming", "exclude_input_in_output", "min_tokens", "end_id"},
        {"output_ids"},
    ),
}


def _tool_target(options, tokenizer, tool: str):
    from trtllm_forge.bench.run import make_target

    allowed = TOOL_TARGETS[tool]
    if options.target not in allowed:
        raise ConfigError("--target", f"{tool} drives {' or '.join(allowed)} here, not {options.target}", f"use --target {allowed[0]}")
    return make_target(options, tokenizer)


async def _probe(target) -> None:
    await target.open()
    await target.close()


def probed_target(options, tokenizer, tool: str, assume_if_down: bool = False):
    """Our target after reading the model's config (its `request_inputs` are what the tools send). With
    assume_if_down, a server that does not answer gives the rendered model's declared inputs instead."""
    target = _tool_target(options, tokenizer, tool)
    try:
        asyncio.run(_probe(target))
        return target, None
    except StepError:
        if not assume_if_down:
            raise
    inputs, outputs = ASSUMED_INPUTS["triton-grpc-tokens" if options.target == "triton-grpc-tokens" else "triton-grpc"]
    if options.target == "triton-http":
        target.inputs, target.count_server, target.perf = inputs, "num_output_tokens" in outputs, False
        target.length_input, target.end_id, target.info.forced_output_len = output_length_plan(inputs, options.force_output_len)
    else:
        target.inputs, target.outputs, target.perf, target.batched = {n: {} for n in inputs}, outputs, False, True
        target.check_contract()
    return target, f"{options.url} did not answer: inputs assumed from the rendered {options.model} model ({', '.join(sorted(inputs))})"


def tool_workload(options, target, requests) -> ToolWorkload:
    grpc_url = options.url
    http_url = options.http_url or (options.url if options.url.startswith("http") else None)
    notes = [f"output length forced by {target.info.forced_output_len}" if target.info.forced_output_len else "output length not forced"]
    return ToolWorkload(
        options.model, grpc_url, http_url, requests, [target.request_inputs(r) for r in requests], options.tokenizer, options.seed, notes
    )


def _requests(options, tokenizer, index: int):
    from trtllm_forge.bench.run import build_requests

    requests = build_requests(options, tokenizer, options.num_requests, np.random.default_rng([options.seed, index]))
    warmup = (
        build_requests(options, tokenizer, options.warmup_requests, np.random.default_rng([options.seed, index, 1]))
        if options.warmup_requests
        else []
    )
    return requests, warmup


def emit_workload(options, kind: str) -> dict:
    """`bench --emit KIND`: write the workload for another tool (nothing is sent, except a config read)."""
    tokenizer = load_tokenizer(options.tokenizer)
    if kind == "aiperf" and options.target.startswith("triton-grpc"):  # AIPerf speaks HTTP: the deployment's HTTP URL
        from dataclasses import replace as copy

        options = copy(options, target="triton-http", url=options.http_url or "http://127.0.0.1:8000")
    if kind == "genai-perf" and options.target == "triton-grpc-tokens":
        raise ConfigError("--emit genai-perf", "GenAI-Perf drives the text contract (ensemble) here", "use --target triton-grpc")
    target, note = probed_target(options, tokenizer, kind, assume_if_down=True)
    requests, _ = _requests(options, tokenizer, 0)
    workload = tool_workload(options, target, requests)
    if note:
        workload.notes.append(note)
    result = emit(kind, workload, options.loads(), options.num_requests, options.out / "emit")
    info(f"{kind}: wrote {', '.join(result['files'])}")
    for command in result["commands"]:
        info(f"  {command}")
    return result


def executable(tool: str) -> tuple[str, dict]:
    """(the tool's executable, the environment to run it in)."""
    from trtllm_forge.bench.perf_analyzer import find_perf_analyzer, problem

    pa = find_perf_analyzer()
    if tool == "perf_analyzer":
        why = problem()
        if why:
            raise StepError("perf_analyzer", why)
        assert pa is not None  # problem() is None only for a perf_analyzer it found
        return str(pa.binary), pa.env()
    path = os.environ.get(TOOL_ENV[tool]) or shutil.which(tool)
    if not path:
        raise StepError(
            tool, f"{tool} is not installed", f"install it in its own venv and set {TOOL_ENV[tool]}=/path/to/{tool} (see README)"
        )
    env = pa.env() if pa else third_party_env()
    if pa:  # GenAI-Perf runs `perf_analyzer` from PATH: ours (the wrapper in this venv's bin) goes first
        env["PATH"] = os.pathsep.join([str(Path(sys.prefix) / "bin"), env.get("PATH", "")])
    return path, env


def run_logged(argv: list[str], env: dict, log: Path, timeout_s: float) -> None:
    """Run one tool process in its own process group with its output in `log`; StepError if it fails."""
    log.parent.mkdir(parents=True, exist_ok=True)
    info(f"$ {shlex.join(argv)}  (log: {log})")
    with open(log, "wb") as handle:
        handle.write(f"$ {shlex.join(argv)}\n".encode())
        handle.flush()
        process = subprocess.Popen(
            argv, stdout=handle, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, cwd=log.parent, start_new_session=True
        )
        try:
            code = process.wait(timeout_s)
        except BaseException:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            raise
    if code != 0:
        lines = [line.strip() for line in log.read_text(errors="replace").splitlines()[1:] if line.strip()]
        said = next((line for line in lines if "error" in line.lower()), lines[-1] if lines else "no output")
        raise StepError(Path(argv[0]).name, f"exited with {code}: {said}", f"see {log}")


# perf_analyzer 2.51 ends with this error (exit 99) when the server's statistics of the model did not move between
# its two snapshots around the measurement: a race on a busy server with few requests, after every request was
# answered (InferenceProfiler::DetermineStatsModelVersion; triton-inference-server/client PR #437 proposed making
# it a warning). The warm-up's requests are done by then; a measured run is run again.
PA_STATS_RACE = "failed to find the requested model version"
# Seen twice in full test runs (2026-12-03, the token-id point at concurrency 2 on a server's first requests, a busy
# machine): exit 0, its console report complete, the profile export empty. Its exporter (triton-inference-server/
# client, src/profile_data_exporter.cc, OutputToFile) truncates the file, then writes through rapidjson's 64 KiB
# FileWriteStream, flushed when the document ends: a document that stops short leaves an empty file and no error.
# What stopped it was not found (not reproduced in 66 runs outside the suite, 45 beside three busy loops, 11 on a
# fresh server); a measured point is run again.
PA_EMPTY_EXPORT = "an empty profile export after exiting 0"
PA_ATTEMPTS = 3


def _run_perf_analyzer(argv: list[str], env: dict, log: Path, timeout_s: float, *, warmup: bool, export: Path | None = None) -> None:
    """Run perf_analyzer once more (up to PA_ATTEMPTS in all, each failed attempt's log kept) after its statistics
    race or an empty `export`; a warm-up (no export) goes on after the race."""
    for attempt in range(1, PA_ATTEMPTS + 1):
        try:
            run_logged(argv, env, log, timeout_s)
        except StepError:
            if PA_STATS_RACE not in log.read_text(errors="replace"):
                raise
            if warmup:
                info(f"perf_analyzer's warm-up: {PA_STATS_RACE!r} after its requests were answered; going on")
                return
            if attempt == PA_ATTEMPTS:
                raise
            problem = f"{PA_STATS_RACE!r} (its statistics race)"
        else:
            if export is None or (export.is_file() and export.stat().st_size > 0):
                return
            if attempt == PA_ATTEMPTS:
                raise StepError("perf_analyzer", f"{PA_EMPTY_EXPORT} ({export}), {attempt} times", f"see {log}")
            problem = PA_EMPTY_EXPORT
        kept = log.with_name(f"{log.stem}.attempt{attempt}{log.suffix}")
        log.replace(kept)
        if export is not None and export.exists():  # perf_analyzer refuses an export path that exists
            export.replace(export.with_name(f"{export.stem}.attempt{attempt}{export.suffix}"))
        info(f"perf_analyzer: {problem}, log kept in {kept}; running the point again")


def _run_point(tool: str, options, workload: ToolWorkload, warmup: ToolWorkload | None, load: LoadSpec, work: Path, tokenizer):
    binary, env = executable(tool)
    # a stuck tool must not hang the run: each request may take request_timeout_s, slots run in parallel
    slots = int(load.value) if load.mode == "concurrency" else max(1, int(load.value))
    timeout = options.request_timeout_s * (-(-options.num_requests // max(1, slots)) + 1) + 120
    if tool == "perf_analyzer":
        if warmup is not None:
            inputs = write_perf_analyzer_inputs(warmup, work / "warmup_inputs.json")
            warm_load = replace(load, value=min(load.value, len(warmup.requests))) if load.mode == "concurrency" else load
            warm_argv = perf_analyzer_argv(binary, warmup, inputs, warm_load, len(warmup.requests), None)
            _run_perf_analyzer(warm_argv, env, work / "warmup.log", timeout, warmup=True)
        inputs = write_perf_analyzer_inputs(workload, work / "inputs.json")
        export = work / "profile_export.json"
        argv = perf_analyzer_argv(binary, workload, inputs, load, options.num_requests, export)
    elif tool == "genai-perf":
        prompts = write_prompts_jsonl(workload, work / "prompts.jsonl")
        argv = genai_perf_argv(
            binary, workload, prompts, load, options.num_requests, work / "artifacts", len(warmup.requests) if warmup else 0
        )
        export = work / "artifacts"
    else:
        prompts = write_aiperf_inputs(workload, work / "prompts.jsonl")
        argv = aiperf_argv(binary, workload, prompts, load, options.num_requests, work / "artifacts")
        export = work / "artifacts"
    if tool == "perf_analyzer":
        _run_perf_analyzer(argv, env, work / f"{tool}.log", timeout, warmup=False, export=export)
    else:
        run_logged(argv, env, work / f"{tool}.log", timeout)
    point = import_export(export, tokenizer)[0]
    point.summary["tool_run"] = {"tool": tool, "argv": argv, "log": str(work / f"{tool}.log"), "export": str(export)}
    return point


def run_tool(options, tool: str) -> dict:
    """Run `tool` at every sweep point of `options`; return the document `--json` prints."""
    if options.duration_s is not None:
        raise ConfigError("--duration", "not supported with --tool (the tools run a request count here)", "use --num-requests")
    tokenizer = load_tokenizer(options.tokenizer)
    target, _ = probed_target(options, tokenizer, tool)
    loads = options.loads()
    multi = len(loads) > 1
    summaries = []
    for index, load in enumerate(loads):
        requests, warmup = _requests(options, tokenizer, index)
        point_dir = options.out / load.label if multi else options.out
        workload = tool_workload(options, target, requests)
        warm = tool_workload(options, target, warmup) if warmup else None
        point = _run_point(tool, options, workload, warm, load, point_dir / tool.replace("-", "_"), tokenizer)
        summary = point.summary
        summary.update(
            source=tool,
            out_dir=str(point_dir),
            config=options.describe(),
            load={**(summary.get("load") or {}), "mode": load.mode, "value": load.value, "num_requests": load.num_requests},
        )
        summary.setdefault("target", {})["forced_output_len"] = target.info.forced_output_len
        requests_seen = summary["requests"]
        requests_seen.update(
            failed=requests_seen.get("failed") or 0,
            sent=requests_seen.get("sent") or options.num_requests,
            errors_by_kind=requests_seen.get("errors_by_kind") or {},
        )
        write_point(point_dir, summary, point.records)
        print_imported(summary, f"{tool} {options.model} {load.label}")
        summaries.append(summary)
    if not multi:
        return summaries[0]
    document = {"schema": "trtllm-forge.bench-sweep/1", "points": summaries, "out_dir": str(options.out), "source": tool}
    tmp = options.out / "sweep.json.tmp"
    tmp.write_text(json.dumps(document, indent=2, sort_keys=True, default=str) + "\n")
    os.replace(tmp, options.out / "sweep.json")
    return document


def write_point(point_dir: Path, summary: dict, records) -> None:
    """Our point files for an imported run: the full set when the export had per-request records."""
    if records is not None and "self_checks" in summary:
        report.write_point(point_dir, summary, records)
        return
    point_dir.mkdir(parents=True, exist_ok=True)
    tmp = point_dir / "summary.json.tmp"
    tmp.write_text(json.dumps(summary, indent=2, sort_keys=True, default=str) + "\n")
    os.replace(tmp, point_dir / "summary.json")


def print_imported(summary: dict, title: str) -> None:
    if "self_checks" in summary:
        report.print_point(summary, title)
        return
    from rich.table import Table

    from trtllm_forge.ui import console

    table = Table(title=title, title_justify="left")
    for column in ("metric", "avg", "p50", "p90", "p99"):
        table.add_column(column, justify="right" if column != "metric" else "left")
    for name, stats in summary["metrics"].items():
        if stats.get("count"):
            table.add_row(name, *("-" if stats.get(s) is None else f"{stats[s]:,.2f}" for s in ("avg", "p50", "p90", "p99")))
    console.print(table)
    if summary.get("warnings"):
        for message in summary["warnings"]:
            warn(message)
