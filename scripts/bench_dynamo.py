#!/usr/bin/env python3
"""NVIDIA Dynamo on CPU (deploy.server dynamo: a frontend and workers serving our OpenVINO engine loop) measured
against itself and against Triton, every deployment made from configs/smollm2-cpu-dynamo.yaml (one engine build,
prefix caching on, the same engine settings everywhere).

  routing     the KV router (the workers publish KV events) against round-robin, the same 2 workers each, on a
              shared-prefix workload: more long system prompts than one worker's KV cache holds, short varied
              questions, sessions whose prompts grow turn by turn (bench options prefix_len, prefix_count and
              turns); our bench's openai target, streamed; TTFT p50/p99
              and output tok/s. Goal: KV TTFT p50 <= 0.7x round-robin's (paired within a repeat).
  throughput  Triton (the ensemble), Dynamo with 1 worker and Dynamo with 2 workers at concurrency 8, streamed (our
              bench: triton-grpc / openai) and not streamed (a closed loop of plain HTTP requests: Triton's
              /v2/models/ensemble/generate, Dynamo's /v1/completions), output length forced; output tok/s and the
              CPU seconds per output token of each deployment's processes (Triton: tritonserver, its python stubs;
              Dynamo: the frontend, the workers; the client). Goal: Dynamo 1 worker >= 95% of Triton's tok/s.

Every deployment runs for the whole script (idle while another is measured); each repeat measures all of them back
to back in an order rotated per repeat, and every ratio is taken within a repeat, then the median over repeats.
A repeat's runs share their seed (the same prompts); each repeat has its own, so no run finds a system prompt an
earlier repeat cached.

Writes results/bench_dynamo/<--name>.json (git commit, machine, every run) after every run; `scripts/readme_tables.py`
renders the blocks of docs/benchmarks/dynamo.md from it (`render_routing_table`, `render_throughput_table`).

    .venv/bin/python scripts/bench_dynamo.py [--repeats 3] [--note "..."] [--name dynamo]
    .venv/bin/python scripts/bench_dynamo.py --smoke      # tiny: proves the script end to end, writes nothing to results/
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trtllm_forge.bench.provenance import git_commit, machine, measured_where, utc_now, write_result

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "configs" / "smollm2-cpu-dynamo.yaml"
RESULTS_DIR = REPO / "results" / "bench_dynamo"
SCHEMA = "trtllm-forge.bench-dynamo/1"
ROUTERS = ("kv", "round-robin")
THROUGHPUT_PATHS = ("triton", "dynamo-1", "dynamo-2")
PATH_LABELS = {
    "kv": "Dynamo, 2 workers, KV router (KV events from the workers)",
    "round-robin": "Dynamo, 2 workers, round-robin",
    "triton": "Triton: ensemble → CPU `tensorrt_llm` model",
    "dynamo-1": "Dynamo: frontend + 1 worker (KV router)",
    "dynamo-2": "Dynamo: frontend + 2 workers (KV router)",
}
ROUTING_GOAL = 0.7  # KV TTFT p50 / round-robin's, at most
THROUGHPUT_GOAL = 0.95  # Dynamo 1 worker's tok/s / Triton's, at least


@dataclass
class Workloads:
    """The two workloads (sizes; the smoke run shrinks them)."""

    # Where a cache-aware router pays: more long prefixes than one worker's KV cache holds, fewer than two hold.
    # Nine system prompts of 700 tokens (22 blocks of 32 each: 189 blocks in all) against a pool of 160 blocks per
    # worker: round-robin shows every prompt to both workers, whose LRU caches then miss in a cycle; the KV router keeps
    # each prompt (and its sessions' history) on one worker, about half of them each. Turn 2 at most
    # 700 + 48 + 32 + 48 = 828 tokens (max_input_len 1024). The counts are odd on purpose: with an even number of
    # prefixes or sessions, round-robin over two workers would send a prefix or a session to the same worker every time.
    prefix_len: int = 700
    prefix_count: int = 9
    question_len: int = 48
    answer_len: int = 32
    turns: int = 2
    routing_concurrency: int = 4
    routing_requests: int = 54  # 27 sessions of 2 turns
    input_len: int = 64
    output_len: int = 64
    concurrency: int = 8
    requests: int = 32
    kv_tokens: int = 5120  # per worker (and Triton's engine): 160 blocks of 32, the same for every deployment


@dataclass
class Deployed:
    """One deployment under test: how the bench reaches it and the process groups its CPU is read from."""

    name: str
    target: str  # the bench's target for the streamed runs
    url: str  # http base URL
    grpc_url: str | None
    model: str
    groups: dict[str, list[int]] = field(default_factory=dict)  # role -> process-group leaders


def info(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ---- the deployments ------------------------------------------------------------------------------------------


def _config(work: Workloads, **dynamo: Any) -> Any:
    from trtllm_forge.config import ForgeConfig, load_config

    data = load_config(CONFIG).model_dump(mode="json")
    data["triton"].update(http_port=0, grpc_port=0, metrics_port=0, bind_address="127.0.0.1")
    data["runtime"]["max_tokens_in_paged_kv_cache"] = work.kv_tokens
    data["bench"]["workloads"] = []
    data["deploy"]["dynamo"].update(dynamo)
    return ForgeConfig.model_validate({**data, "config_dir": str(CONFIG.parent)})


def _linked_workdir(base: Path, workdir: Path) -> Path:
    """`workdir` holding `base`'s import and build as if they had run there (hard links; stage_results reads their
    recorded paths under the new workdir)."""
    if not (workdir / "build").is_dir():
        shutil.rmtree(workdir, ignore_errors=True)
        (workdir / "logs").mkdir(parents=True)
        for stage in ("import", "build"):
            shutil.copytree(base / stage, workdir / stage, symlinks=True, copy_function=os.link)
    return workdir


def prepare(root: Path, work: Workloads) -> tuple[Path, Path]:
    """Import and build once under `root`/base (cached when unchanged); (engine dir, checkpoint dir)."""
    from trtllm_forge.builders.openvino.builder import build_engine

    from trtllm_forge.importer.stage import import_checkpoint

    config = _config(work)
    base = root / "base"
    checkpoint = import_checkpoint(config, base).checkpoint_dir
    built = build_engine(config, base, checkpoint)
    assert built.engine_dir is not None
    return built.engine_dir, checkpoint


def start_dynamo(stack: ExitStack, root: Path, name: str, work: Workloads, **dynamo: Any) -> Deployed:
    from trtllm_forge.deploy import dynamo_local

    config = _config(work, **dynamo)
    workdir = _linked_workdir(root / "base", root / name)
    dynamo_local.stop(workdir)  # a run killed earlier
    started = dynamo_local.start(config, workdir, die_with_caller=True)
    stack.callback(dynamo_local.stop, workdir)
    groups = {"frontend": [started.frontend.pid], "workers": [w.pid for w in started.workers]}
    return Deployed(name, "openai", started.frontend.url, None, started.model, groups)


def start_triton(stack: ExitStack, root: Path, work: Workloads, engine_dir: Path) -> Deployed:
    from trtllm_forge.deploy.server import start_server, stop_server
    from trtllm_forge.entrypoint import entry_model
    from trtllm_forge.render.repository import render_repository

    config = _config(work).model_copy(deep=True)
    config.deploy.server = "triton"
    workdir = _linked_workdir(root / "base", root / "triton")
    repository = render_repository(config, workdir, engine_dir).repository
    deployment = start_server(config, workdir, repository, die_with_caller=True)
    stack.callback(stop_server, deployment, quiet=True)
    assert deployment.pgid is not None
    return Deployed("triton", "triton-grpc", deployment.http_url, deployment.grpc_url, entry_model(config), {"server": [deployment.pgid]})


# ---- CPU by role ----------------------------------------------------------------------------------------------


def cpu_by_role(deployed: Deployed) -> dict[str, float]:
    """CPU seconds used so far by each role's process groups (Triton: tritonserver itself, its python stubs) and by
    this process (the client)."""
    from trtllm_forge.processes import cpu_seconds, group_members

    times = os.times()
    roles: dict[str, float] = {"client": times.user + times.system}
    for role, leaders in deployed.groups.items():
        for leader in leaders:
            for pid in group_members(leader):
                seconds = cpu_seconds(pid) or 0.0
                name = ("tritonserver" if pid == leader else "stubs") if role == "server" else role
                roles[name] = roles.get(name, 0.0) + seconds
    return roles


def _spent(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {role: round(after.get(role, 0.0) - before.get(role, 0.0), 3) for role in after}


# ---- the runs -------------------------------------------------------------------------------------------------


def bench_streamed(deployed: Deployed, checkpoint: Path, out: Path, seed: int, **workload: Any) -> dict[str, Any]:
    """One run of our bench (streamed) and the numbers the tables need."""
    from trtllm_forge.bench.run import BenchOptions, raise_if_interrupted, run_bench
    from trtllm_forge.bench.specs import LengthSpec

    concurrency = int(workload.pop("concurrency"))
    options = BenchOptions(
        target=deployed.target,
        url=deployed.grpc_url if deployed.target == "triton-grpc" and deployed.grpc_url else deployed.url,
        model=deployed.model,
        concurrency=[concurrency],
        num_requests=int(workload.pop("requests")),
        warmup_requests=min(concurrency, 2),
        input_len=LengthSpec(int(workload.pop("input_len"))),
        output_len=LengthSpec(int(workload.pop("output_len"))),
        tokenizer=checkpoint,
        seed=seed,
        out=out,
        plots=False,
        request_timeout_s=300.0,
        **workload,
    )
    before = cpu_by_role(deployed)
    document = run_bench(options)
    raise_if_interrupted(document)  # Ctrl-C/SIGTERM stop the script, not just this bench
    cpu = _spent(before, cpu_by_role(deployed))
    point = (document.get("points") or [document])[0]
    metrics = point["metrics"]

    def stat(name: str, which: str) -> float | None:
        value = (metrics.get(name) or {}).get(which)
        return None if value is None else round(float(value), 3)

    output_tokens = (metrics.get("output_tokens") or {}).get("avg") or 0.0
    completed = int(point["requests"]["completed"])
    return {
        "completed": completed,
        "failed": int(point["requests"]["failed"]),
        "ttft_ms_p50": stat("ttft_ms", "p50"),
        "ttft_ms_p99": stat("ttft_ms", "p99"),
        "tpot_ms_p50": stat("tpot_ms", "p50"),
        "tok_s": stat("output_token_throughput_per_s", "avg"),
        "output_tokens": round(output_tokens * completed),
        "cpu_s": cpu,
    }


def _post_json(url: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
    """The JSON answer; an HTTP error is a RuntimeError with its status and the start of its body."""
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return dict(json.loads(response.read()))
    except urllib.error.HTTPError as exc:
        raise RuntimeError(f"HTTP {exc.code} from {url}: {exc.read()[:300]!r}") from None


def unstreamed_request(deployed: Deployed, prompt: str, tokens: int) -> Callable[[], int]:
    """One request without streaming, forced to `tokens` output tokens; returns the tokens the server says it made."""
    if deployed.target == "openai":
        url = f"{deployed.url}/v1/completions"
        body = {
            "model": deployed.model,
            "prompt": prompt,
            "max_tokens": tokens,
            "temperature": 0.0,
            "ignore_eos": True,
            "min_tokens": tokens,
        }
        return lambda: int(_post_json(url, body, 300)["usage"]["completion_tokens"])
    url = f"{deployed.url}/v2/models/{deployed.model}/generate"
    triton_body = {"text_input": prompt, "max_tokens": tokens, "min_tokens": tokens, "return_num_output_tokens": True}

    def send() -> int:
        count = _post_json(url, triton_body, 300)["num_output_tokens"]
        return int(count[0] if isinstance(count, list) else count)

    return send


def closed_loop_unstreamed(deployed: Deployed, prompts: list[str], tokens: int, concurrency: int) -> dict[str, Any]:
    """`concurrency` client threads, each sending the next prompt when its last request ended (plain HTTP, not
    streamed); output tok/s over the wall time, errors counted."""
    calls = [unstreamed_request(deployed, prompt, tokens) for prompt in prompts]
    cursor, lock = [0], threading.Lock()
    made: list[int] = []
    errors: list[str] = []

    def client() -> None:
        while True:
            with lock:
                position = cursor[0]
                cursor[0] += 1
            if position >= len(calls):
                return
            try:
                count = calls[position]()
            except (OSError, ValueError, KeyError, RuntimeError) as exc:
                with lock:
                    errors.append(f"{type(exc).__name__}: {exc}")
                continue
            with lock:
                made.append(count)

    for call in calls[: min(2, len(calls))]:  # warm-up, excluded
        call()
    threads = [threading.Thread(target=client, daemon=True) for _ in range(concurrency)]
    before = cpu_by_role(deployed)
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - started
    cpu = _spent(before, cpu_by_role(deployed))
    return {
        "completed": len(made),
        "failed": len(errors),
        "errors": errors[:3],
        "tok_s": round(sum(made) / seconds, 3) if seconds else None,
        "output_tokens": sum(made),
        "seconds": round(seconds, 3),
        "cpu_s": cpu,
    }


def synthetic_prompts(checkpoint: Path, work: Workloads, seed: int) -> list[str]:
    import numpy as np

    from trtllm_forge.bench.specs import LengthSpec
    from trtllm_forge.bench.workload import load_tokenizer, synthetic

    requests = synthetic(
        work.requests, LengthSpec(work.input_len), LengthSpec(work.output_len), np.random.default_rng(seed), load_tokenizer(checkpoint)
    )
    return [r.prompt for r in requests]


def _measured(document: dict[str, Any], out: Path | None, row: dict[str, Any]) -> None:
    document["runs"].append(row)
    if out is not None:
        write_result(out, document)
    info(json.dumps({k: v for k, v in row.items() if k != "cpu_s"}))


def run(args: argparse.Namespace, work: Workloads, out: Path | None) -> dict[str, Any]:
    """Start every deployment, measure, write `out` after every run (a killed run keeps what it measured;
    `finished_utc` marks a whole one)."""
    root = args.workdir.resolve()
    document: dict[str, Any] = {
        "schema": SCHEMA,
        "git_commit": git_commit(),
        "machine": machine(),
        "started_utc": utc_now(),
        "config": str(CONFIG.relative_to(REPO)),
        "workloads": {
            "routing": {
                "system_prompt_tokens": work.prefix_len,
                "system_prompts": work.prefix_count,
                "question_tokens": work.question_len,
                "answer_tokens": work.answer_len,
                "turns": work.turns,
                "concurrency": work.routing_concurrency,
                "requests": work.routing_requests,
                "streamed": True,
            },
            "throughput": {
                "input_tokens": work.input_len,
                "output_tokens": work.output_len,
                "concurrency": work.concurrency,
                "requests": work.requests,
            },
            "kv_tokens_per_engine": work.kv_tokens,
        },
        "labels": PATH_LABELS,
        "repeats": args.repeats,
        "runs": [],
    }
    if args.note:
        document["note"] = args.note
    engine_dir, checkpoint = prepare(root, work)
    with ExitStack() as stack, tempfile.TemporaryDirectory(prefix="bench-dynamo-") as tmp:
        deployed = {
            "kv": start_dynamo(stack, root, "kv", work, workers=2, router_mode="kv"),
            "round-robin": start_dynamo(stack, root, "round-robin", work, workers=2, router_mode="round-robin"),
            "dynamo-1": start_dynamo(stack, root, "dynamo-1", work, workers=1, router_mode="kv"),
            "triton": start_triton(stack, root, work, engine_dir),
        }
        deployed["dynamo-2"] = deployed["kv"]
        for repeat in range(args.repeats):
            seed = args.seed + 1000 * repeat
            for path in _rotated(ROUTERS, repeat):
                row = {"part": "routing", "path": path, "repeat": repeat}
                try:
                    row |= bench_streamed(
                        deployed[path],
                        checkpoint,
                        Path(tmp) / f"{path}-{repeat}",
                        seed,
                        concurrency=work.routing_concurrency,
                        requests=work.routing_requests,
                        input_len=work.question_len,
                        output_len=work.answer_len,
                        prefix_len=work.prefix_len,
                        prefix_count=work.prefix_count,
                        turns=work.turns,
                    )
                except Exception as exc:
                    row["error"] = f"{type(exc).__name__}: {exc}"
                _measured(document, out, row)
            prompts = synthetic_prompts(checkpoint, work, seed)
            for path in _rotated(THROUGHPUT_PATHS, repeat):
                for streamed in (False, True):
                    row = {"part": "throughput", "path": path, "streamed": streamed, "repeat": repeat}
                    try:
                        if streamed:
                            row |= bench_streamed(
                                deployed[path],
                                checkpoint,
                                Path(tmp) / f"{path}-s-{repeat}",
                                seed,
                                concurrency=work.concurrency,
                                requests=work.requests,
                                input_len=work.input_len,
                                output_len=work.output_len,
                            )
                        else:
                            row |= closed_loop_unstreamed(deployed[path], prompts, work.output_len, work.concurrency)
                    except Exception as exc:
                        row["error"] = f"{type(exc).__name__}: {exc}"
                    _measured(document, out, row)
    document["finished_utc"] = utc_now()
    document["machine"]["load_average_end"] = list(os.getloadavg())
    if out is not None:
        write_result(out, document)
    return document


def _rotated(names: tuple[str, ...], repeat: int) -> list[str]:
    shift = repeat % len(names)
    return [*names[shift:], *names[:shift]]


# ---- the blocks of docs/benchmarks/dynamo.md ----------------------------------------------------------------------


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _runs(document: dict[str, Any], part: str) -> list[dict[str, Any]]:
    return [r for r in document["runs"] if r.get("part") == part and "error" not in r]


def _paired(runs: list[dict[str, Any]], path: str, base: str, key: str, **match: Any) -> list[float]:
    """`path`'s value of `key` over `base`'s, per repeat where both have it."""

    def by_repeat(name: str) -> dict[int, float]:
        return {
            r["repeat"]: float(r[key]) for r in runs if r["path"] == name and r.get(key) and all(r.get(k) == v for k, v in match.items())
        }

    mine, theirs = by_repeat(path), by_repeat(base)
    return [mine[repeat] / theirs[repeat] for repeat in sorted(mine) if repeat in theirs]


def _where(document: dict[str, Any]) -> str:
    complete = "" if document.get("finished_utc") else f"; INCOMPLETE: stopped after {len(document['runs'])} runs"
    return measured_where(document) + complete


def _errors(document: dict[str, Any], part: str) -> list[str]:
    failed = [r for r in document["runs"] if r.get("part") == part and "error" in r]
    return [f"{len(failed)} run(s) failed: " + "; ".join(f"{r['path']} r{r['repeat']}: {r['error']}" for r in failed)] if failed else []


def render_routing_table(document: dict[str, Any]) -> str:
    """KV router against round-robin on the shared-prefix workload: medians over the repeats, the paired ratio."""
    work = document["workloads"]["routing"]
    runs = _runs(document, "routing")
    lines = [
        f"Workload: {work['system_prompts']} system prompts of {work['system_prompt_tokens']} tokens (sessions take them in "
        f"turn) against a KV cache of {document['workloads']['kv_tokens_per_engine']} tokens per worker, questions of {work['question_tokens']} tokens, "
        f"answers of {work['answer_tokens']}, sessions of {work['turns']} turns (a turn's prompt holds its session's earlier "
        f"turns), {work['requests']} requests at concurrency {work['concurrency']}, streamed; median of "
        f"{document['repeats']} interleaved repeats; {_where(document)}",
        "",
        "| router | runs | TTFT p50 (ms) | TTFT p99 (ms) | TPOT p50 (ms) | output tok/s | failed requests |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for path in ROUTERS:
        rows = [r for r in runs if r["path"] == path]
        if not rows:
            continue
        cells = [document["labels"][path], str(len(rows))]
        for key in ("ttft_ms_p50", "ttft_ms_p99", "tpot_ms_p50", "tok_s"):
            cells.append(_fmt(_median([r[key] for r in rows if r.get(key) is not None])))
        cells.append(str(sum(r["failed"] for r in rows)))
        lines.append("| " + " | ".join(cells) + " |")
    ratios = _paired(runs, "kv", "round-robin", "ttft_ms_p50")
    ratio = _median(ratios)
    if ratio is not None:
        verdict = "MET" if ratio <= ROUTING_GOAL else "MISS"
        per_repeat = ", ".join(f"{r:.2f}" for r in ratios)
        lines += ["", f"- {verdict}: TTFT p50 with the KV router ≤ {ROUTING_GOAL}× round-robin's: {ratio:.2f}× (per repeat: {per_repeat})"]
    lines += _errors(document, "routing")
    return "\n".join(lines) + "\n"


CPU_ROLES = {"triton": ("tritonserver", "stubs"), "dynamo": ("frontend", "workers")}


def _cpu_cell(rows: list[dict[str, Any]], path: str) -> str:
    roles = CPU_ROLES["triton" if path == "triton" else "dynamo"]
    shares = []
    for role in (*roles, "client"):
        per_token = [1000.0 * r["cpu_s"].get(role, 0.0) / r["output_tokens"] for r in rows if r.get("output_tokens")]
        shares.append(f"{role} {_fmt(_median(per_token), 2)}")
    return " / ".join(shares)


def render_throughput_table(document: dict[str, Any]) -> str:
    """Triton against Dynamo with 1 and 2 workers at one concurrency, streamed and not: medians, paired ratios,
    CPU milliseconds per output token by process."""
    work = document["workloads"]["throughput"]
    runs = _runs(document, "throughput")
    lines = [
        f"Workload: {work['input_tokens']} prompt tokens → {work['output_tokens']} output tokens (forced), greedy, "
        f"{work['requests']} requests at concurrency {work['concurrency']}; median of {document['repeats']} interleaved "
        f"repeats; {_where(document)}",
        "",
        "| streamed | deployment | runs | output tok/s | vs Triton (per repeat, median) | CPU ms per output token (median) | failed requests |",
        "|---|---|---:|---:|---:|---|---:|",
    ]
    goals = []
    for streamed in (False, True):
        for path in THROUGHPUT_PATHS:
            rows = [r for r in runs if r["path"] == path and r["streamed"] == streamed]
            if not rows:
                continue
            ratio = _median(_paired(runs, path, "triton", "tok_s", streamed=streamed))
            cells = [
                "yes" if streamed else "no",
                document["labels"][path],
                str(len(rows)),
                _fmt(_median([r["tok_s"] for r in rows if r.get("tok_s")])),
                "-" if ratio is None else f"{ratio:.2f}×",
                _cpu_cell(rows, path),
                str(sum(r["failed"] for r in rows)),
            ]
            lines.append("| " + " | ".join(cells) + " |")
            if path == "dynamo-1" and ratio is not None:
                verdict = "MET" if ratio >= THROUGHPUT_GOAL else "MISS"
                goals.append(
                    f"- {verdict}: Dynamo with 1 worker ≥ {THROUGHPUT_GOAL:.0%} of Triton's tok/s, "
                    f"{'streamed' if streamed else 'not streamed'}: {ratio:.0%}"
                )
    lines += ["", *goals, *_errors(document, "throughput")]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--name", default="dynamo", help="the result file: results/bench_dynamo/NAME.json")
    parser.add_argument("--workdir", type=Path, default=REPO / "forge-work" / "bench-dynamo", help="import/build cache, deployments")
    parser.add_argument("--note", default=None, help="a note stored with the results (e.g. that the machine was busy)")
    parser.add_argument("--smoke", action="store_true", help="tiny workloads, 1 repeat, nothing written to results/ (proves the script)")
    args = parser.parse_args()
    work = Workloads()
    out: Path | None = RESULTS_DIR / f"{args.name}.json"
    if args.smoke:
        work = Workloads(
            prefix_len=96, prefix_count=3, question_len=8, answer_len=4, turns=2, routing_concurrency=2, routing_requests=4, input_len=8, output_len=4,
            concurrency=2, requests=4, kv_tokens=8192,
        )  # fmt: skip
        args.repeats = 1
        out = None
    from trtllm_forge.processes import sigterm_as_interrupt

    with sigterm_as_interrupt():  # a SIGTERM between two benches stops the deployments as Ctrl-C does
        document = run(args, work, out)
    print(render_routing_table(document))
    print(render_throughput_table(document))
    if out is not None:
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
