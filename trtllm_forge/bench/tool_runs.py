"""`bench --tool NAME`: run another load generator on our workload, import its export, write our summary format
(summary.json / summary.csv / requests.jsonl per point, sweep.json) so `bench compare` shows forge and the tool
side by side; `bench --emit NAME`: write that workload's input file and exact command lines instead (nothing is
sent, except a config read). What differs per tool is its module under bench/tools/ (registry.py lists them).

The workload is ours exactly: the same seeded prompts and output lengths as `bench` with the same options
(`run.build_requests`), the same inputs per request (the target's `request_inputs`, read from the model's
config), streaming. Each tool run has its own log; a run that fails keeps its log and exits 1.
"""

from __future__ import annotations

import asyncio
import shlex
from pathlib import Path
from typing import Any

import numpy as np

from trtllm_forge.atomic_files import write_json_atomic
from trtllm_forge.bench.exports import import_export, print_imported, write_point
from trtllm_forge.bench.options import BenchOptions
from trtllm_forge.bench.run import build_requests, make_target
from trtllm_forge.bench.runner import LoadSpec
from trtllm_forge.bench.target import output_length_plan
from trtllm_forge.bench.target_grpc import TritonGrpcTarget
from trtllm_forge.bench.target_http import TritonHttpTarget
from trtllm_forge.bench.tools import registry
from trtllm_forge.bench.tools.protocol import BenchTool, ImportedPoint, PointRun, ToolWorkload
from trtllm_forge.bench.workload import BenchRequest, load_tokenizer
from trtllm_forge.errors import ConfigError, StepError
from trtllm_forge.ui import info

ToolTarget = TritonGrpcTarget | TritonHttpTarget  # what the tools drive: Triton's text or token-id contract

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


def _tool_target(options: BenchOptions, tokenizer: Any, tool: BenchTool) -> ToolTarget:
    if options.target not in tool.targets:
        raise ConfigError(
            "--target", f"{tool.name} drives {' or '.join(tool.targets)} here, not {options.target}", f"use --target {tool.targets[0]}"
        )
    target = make_target(options, tokenizer)
    assert isinstance(target, ToolTarget)  # every tool's targets are Triton's
    return target


async def _probe(target: ToolTarget) -> None:
    await target.open()
    await target.close()


def probed_target(options: BenchOptions, tokenizer: Any, tool: BenchTool, assume_if_down: bool = False) -> tuple[ToolTarget, str | None]:
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
    if isinstance(target, TritonHttpTarget):
        target.inputs, target.count_server, target.perf = inputs, "num_output_tokens" in outputs, False
        target.length_input, target.end_id, target.info.forced_output_len = output_length_plan(inputs, options.force_output_len)
    else:
        target.inputs, target.outputs, target.perf, target.batched = {n: {} for n in inputs}, outputs, False, True
        target.check_contract()
    return target, f"{options.url} did not answer: inputs assumed from the rendered {options.model} model ({', '.join(sorted(inputs))})"


def tool_workload(options: BenchOptions, target: ToolTarget, requests: list[BenchRequest]) -> ToolWorkload:
    grpc_url = options.url
    http_url = options.http_url or (options.url if options.url.startswith("http") else None)
    notes = [f"output length forced by {target.info.forced_output_len}" if target.info.forced_output_len else "output length not forced"]
    return ToolWorkload(
        options.model, grpc_url, http_url, requests, [target.request_inputs(r) for r in requests], options.tokenizer, options.seed, notes
    )


def _requests(options: BenchOptions, tokenizer: Any, index: int) -> tuple[list[BenchRequest], list[BenchRequest]]:
    requests = build_requests(options, tokenizer, options.num_requests, np.random.default_rng([options.seed, index]))
    warmup = (
        build_requests(options, tokenizer, options.warmup_requests, np.random.default_rng([options.seed, index, 1]))
        if options.warmup_requests
        else []
    )
    return requests, warmup


def emit_workload(options: BenchOptions, name: str) -> dict[str, Any]:
    """`bench --emit NAME`: write the workload for another tool (nothing is sent, except a config read)."""
    tool = registry.tool(name)
    tokenizer = load_tokenizer(options.tokenizer)
    options = tool.emit_options(options)
    target, note = probed_target(options, tokenizer, tool, assume_if_down=True)
    requests, _ = _requests(options, tokenizer, 0)
    workload = tool_workload(options, target, requests)
    if note:
        workload.notes.append(note)
    result = write_emitted(tool, workload, options.loads(), options.num_requests, options.out / "emit")
    info(f"{name}: wrote {', '.join(result['files'])}")
    for command in result["commands"]:
        info(f"  {command}")
    return result


def write_emitted(tool: BenchTool, workload: ToolWorkload, loads: list[LoadSpec], count: int, out: Path) -> dict[str, Any]:
    """Write the input file and a script of the exact command lines for `tool`; return {tool, files, commands, argv}."""
    out.mkdir(parents=True, exist_ok=True)
    inputs = tool.write_inputs(workload, out / tool.emitted_inputs)
    commands = [tool.argv(tool.name, workload, inputs, load, count, out / tool.emitted_export(load.label)) for load in loads]
    script = out / f"run_{tool.name.replace('-', '_')}.sh"
    notes = "".join(f"# {note}\n" for note in workload.notes)
    header = f"#!/bin/sh\n# Same workload as trtllm-forge bench (`bench --tool` runs these and imports the exports).\n{notes}set -e\n"
    script.write_text(header + "".join(shlex.join(c) + "\n" for c in commands))
    script.chmod(0o755)
    return {"tool": tool.name, "files": [str(inputs), str(script)], "commands": [shlex.join(c) for c in commands], "argv": commands}


def _run_point(
    tool: BenchTool,
    options: BenchOptions,
    workload: ToolWorkload,
    warmup: ToolWorkload | None,
    load: LoadSpec,
    work: Path,
    tokenizer: Any,
) -> ImportedPoint:
    executable = tool.executable()
    # a stuck tool must not hang the run: each request may take request_timeout_s, slots run in parallel
    slots = int(load.value) if load.mode == "concurrency" else max(1, int(load.value))
    timeout = options.request_timeout_s * (-(-options.num_requests // max(1, slots)) + 1) + 120
    log = work / f"{tool.name}.log"
    measured = tool.measure(PointRun(executable, workload, warmup, load, options.num_requests, work, log, timeout))
    point = import_export(measured.export, tokenizer)[0]
    point.summary["tool_run"] = {"tool": tool.name, "argv": measured.argv, "log": str(log), "export": str(measured.export)}
    return point


def run_tool(options: BenchOptions, name: str) -> dict[str, Any]:
    """Run the tool `name` at every sweep point of `options`; return the document `--json` prints."""
    if options.duration_s is not None:
        raise ConfigError("--duration", "not supported with --tool (the tools run a request count here)", "use --num-requests")
    tool = registry.tool(name)
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
        point = _run_point(tool, options, workload, warm, load, point_dir / name.replace("-", "_"), tokenizer)
        summary = point.summary
        summary.update(
            source=name,
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
        print_imported(summary, f"{name} {options.model} {load.label}")
        summaries.append(summary)
    if not multi:
        return summaries[0]
    document = {"schema": "trtllm-forge.bench-sweep/1", "points": summaries, "out_dir": str(options.out), "source": name}
    write_json_atomic(options.out / "sweep.json", document)
    return document
