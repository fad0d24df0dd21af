"""One `bench` invocation: build the workload, open the target, run each sweep point, write the outputs."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from trtllm_forge import __version__
from trtllm_forge.atomic_files import write_json_atomic
from trtllm_forge.bench import plots, report, server_metrics
from trtllm_forge.bench.metrics import summarize
from trtllm_forge.bench.options import BenchOptions
from trtllm_forge.bench.records import RequestRecord
from trtllm_forge.bench.runner import LoadSpec, RunResult, StubCheck, run_load
from trtllm_forge.bench.target import Target, now_ns
from trtllm_forge.bench.workload import BenchRequest, from_dataset, load_tokenizer, sessions, synthetic, take
from trtllm_forge.errors import ConfigError, StepError
from trtllm_forge.ui import info, warn

if TYPE_CHECKING:
    from multiprocessing.queues import Queue

# gRPC streams (a connection and a reader thread each) when --streams is not given. At concurrency 64 on 2 cores, 64
# client threads left responses unread for 40-320 ms at p99 when the client stamped them itself (grpcio; TTFT error vs
# the model's stamps +5.3% and +13.5% in two full fidelity runs; 16 lanes carrying 4 requests each: +0.1 to +0.3% in
# 3 of 4 interleaved runs). The stamps are the kernel's now (bench/grpc_wire.py), but a reader that falls behind
# still stamps a burst with its newest arrival, and fewer threads leave the server more of the cores.
MAX_AUTO_STREAMS = 16


def auto_streams(options: BenchOptions) -> int:
    """One stream and client thread per request in flight, as perf_analyzer has one stream per concurrency slot, at
    most MAX_AUTO_STREAMS (past that, the streams carry several requests each, matched by id)."""
    in_flight = max([*options.concurrency, options.max_concurrency or 0, *(4 * r for r in options.request_rate), 1])
    per_worker = -(-int(in_flight) // max(1, options.workers))
    return max(1, min(MAX_AUTO_STREAMS, per_worker))


def make_target(options: BenchOptions, tokenizer: Any) -> Target:
    kwargs: dict[str, Any] = dict(tokenizer=tokenizer, force_output_len=options.force_output_len, request_timeout=options.request_timeout_s)
    if options.target in ("triton-grpc", "triton-grpc-tokens"):
        from trtllm_forge.bench.target_grpc import TritonGrpcTarget, TritonGrpcTokensTarget

        cls = TritonGrpcTarget if options.target == "triton-grpc" else TritonGrpcTokensTarget
        return cls(options.url, options.model, streams=options.streams or auto_streams(options), **kwargs)
    from trtllm_forge.bench.target_http import OpenAITarget, TritonHttpTarget

    if options.target == "triton-http":
        return TritonHttpTarget(options.url, options.model, **kwargs)
    return OpenAITarget(options.url, options.model, endpoint=options.openai_endpoint, **kwargs)


MAX_UNIQUE_PROMPTS = 4096  # duration-bound points cycle through at most this many synthetic prompts


def build_requests(options: BenchOptions, tokenizer: Any, n: int, rng: np.random.Generator) -> list[BenchRequest]:
    shared = options.prefix_len > 0 or options.turns > 1 or options.prefix_count > 1
    if options.dataset is not None:
        if shared:
            raise ConfigError("--prefix-len/--prefix-count/--turns", "shape synthetic prompts, not a --dataset", "drop them or the dataset")
        pool = from_dataset(options.dataset, tokenizer, options.output_len if options.output_len_given else None, rng)
        return take(pool, n, rng)
    if shared:
        return sessions(n, options.prefix_len, options.turns, options.input_len, options.output_len, rng, tokenizer, options.prefix_count)
    requests = synthetic(min(n, MAX_UNIQUE_PROMPTS), options.input_len, options.output_len, rng, tokenizer)
    return [requests[i % len(requests)] for i in range(n)]


def stub_check(options: BenchOptions) -> StubCheck | None:
    """What a stall asks: the deployment's python stubs, when the bench knows the deployment."""
    return StubCheck(*options.server_stubs) if options.server_stubs else None


def _versions() -> dict[str, str]:
    from importlib.metadata import version

    import grpc
    import tritonclient

    return {
        "trtllm_forge": __version__,
        "tritonclient": getattr(tritonclient, "__version__", "?"),
        "grpcio": grpc.__version__,
        "hpack": version("hpack"),
    }


async def _run_all(options: BenchOptions, tokenizer: Any) -> list[tuple[LoadSpec, dict[str, Any], list[RequestRecord]]]:
    target = make_target(options, tokenizer)
    await target.open()
    results = []
    try:
        for index, load in enumerate(options.loads()):
            rng = np.random.default_rng([options.seed, index])
            # Without a duration every point sends exactly num_requests; with one, enough to never run dry.
            n = (
                options.num_requests
                if load.duration_s is None
                else max(options.num_requests, int(load.duration_s * (load.value if load.mode == "rate" else 200) * 2) + 16)
            )
            requests = build_requests(options, tokenizer, n, rng)
            warmup = (
                build_requests(options, tokenizer, options.warmup_requests, np.random.default_rng([options.seed, index, 1]))
                if options.warmup_requests
                else []
            )
            info(
                f"bench {options.target} {options.model}: {load.label} ({len(requests) if load.duration_s is None else f'{load.duration_s:g} s'}), warm-up {len(warmup)}"
            )
            before = server_metrics.scrape(options.metrics_url)
            with server_metrics.Sampler(options.metrics_url) as sampler:
                if options.workers > 1:
                    result = await asyncio.get_running_loop().run_in_executor(None, run_sharded, options, load, requests, warmup)
                else:
                    result = await run_load(
                        target, requests, warmup, load, options.seed, stall_s=options.stall_timeout_s, stubs=stub_check(options)
                    )
            after = server_metrics.scrape(options.metrics_url)
            context = {
                "target": {**target.info.__dict__},
                "config": options.describe(),
                "seed": options.seed,
                "server_metrics": server_metrics.report(before, after, sampler.samples),
                "versions": {**_versions(), "server": target.info.server_version},
            }
            summary = summarize(result, options.slo, context)
            results.append((load, summary, result.records))
            if result.aborted:
                break
    finally:
        await target.close()
    return results


def _shard_main(
    options: BenchOptions,
    load: LoadSpec,
    requests: list[BenchRequest],
    warmup: list[BenchRequest],
    shard: int,
    ready: Queue[int],
    start_queue: Queue[int],
    results: Queue[tuple[int, RunResult | str]],
) -> None:
    """One client process of a sharded run (multiprocessing target)."""

    async def main() -> RunResult:
        target = make_target(options, load_tokenizer(options.tokenizer))
        await target.open()
        loop = asyncio.get_running_loop()

        async def start_at() -> int:
            ready.put(shard)
            return await loop.run_in_executor(None, start_queue.get)

        try:
            mine = warmup[shard :: options.workers]
            return await run_load(
                target, requests, mine, load, options.seed, (shard, options.workers), start_at, options.stall_timeout_s, stub_check(options)
            )
        finally:
            await target.close()

    try:
        results.put((shard, asyncio.run(main())))
    except BaseException as exc:
        ready.put(shard)
        results.put((shard, f"{type(exc).__name__}: {exc}"))


def run_sharded(options: BenchOptions, load: LoadSpec, requests: list[BenchRequest], warmup: list[BenchRequest]) -> RunResult:
    """Spread one sweep point over `options.workers` processes that start together; merge their records."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    ready, results = ctx.Queue(), ctx.Queue()
    starts = [ctx.Queue() for _ in range(options.workers)]
    procs = [
        ctx.Process(target=_shard_main, args=(options, load, requests, warmup, k, ready, starts[k], results), daemon=True)
        for k in range(options.workers)
    ]
    for proc in procs:
        proc.start()
    for _ in procs:
        ready.get(timeout=300)
    start = now_ns() + 20_000_000  # every shard waits for the same monotonic instant
    for queue in starts:
        queue.put(start)
    parts = dict(results.get() for _ in procs)
    for proc in procs:
        proc.join(30)
    failures = [v for v in parts.values() if isinstance(v, str)]
    if failures:
        raise StepError("bench --workers", f"a client process failed: {failures[0]}", "rerun with --workers 1 to see the error directly")
    runs: list[RunResult] = [parts[k] for k in sorted(parts)]
    return RunResult(
        load,
        [r for run in runs for r in run.records],
        min(r.start_ns for r in runs),
        max(r.end_ns for r in runs),
        min(r.wall_start_ns for r in runs),
        max(r.cpu_seconds for r in runs),
        [x for r in runs for x in r.loop_lag_ns],
        next((r.aborted for r in runs if r.aborted), None),
        max((r.steal_share for r in runs if r.steal_share is not None), default=None),  # machine-wide: each shard saw about the same
    )


def _plots(make: Callable[[], list[str]], out: Path) -> list[str]:
    try:
        out.mkdir(parents=True, exist_ok=True)
        return make()
    except Exception as exc:
        warn(f"plots not written: {type(exc).__name__}: {exc}")
        return []


def run_bench(options: BenchOptions) -> dict[str, Any]:
    """Run every sweep point; return the document `--json` prints (one point's summary, or a sweep)."""
    tokenizer = load_tokenizer(options.tokenizer)
    if options.target == "triton-grpc-tokens" and tokenizer is None and options.dataset is None:
        raise ConfigError("--tokenizer", "the token-id target needs token ids", "pass --tokenizer DIR or a --dataset with input_ids")
    results = asyncio.run(_run_all(options, tokenizer))
    out = options.out
    multi = len(results) > 1 or len(options.loads()) > 1
    summaries = []
    for load, summary, records in results:
        point_dir = out / load.label if multi else out
        summary["out_dir"] = str(point_dir)
        # Shown before it is written: what was measured reaches the terminal (and --json) even when the disk is full.
        report.print_point(summary, f"{options.target} {options.model} {load.label}")
        _written(summary, point_dir, partial(_write_point, options, point_dir, summary, records, load.label))
        summaries.append(summary)
    if not multi:
        return summaries[0]
    report.print_sweep(summaries)
    document = {"schema": "trtllm-forge.bench-sweep/1", "points": summaries, "out_dir": str(out)}
    _written(document, out, partial(_write_sweep, options, out, document, summaries))
    return document


def _write_point(options: BenchOptions, point_dir: Path, summary: dict[str, Any], records: list[RequestRecord], label: str) -> None:
    if options.plots:
        summary["plots"] = _plots(partial(plots.point_plots, point_dir, records, f"{options.model} {label}"), point_dir)
    report.write_point(point_dir, summary, records)


def _write_sweep(options: BenchOptions, out: Path, document: dict[str, Any], summaries: list[dict[str, Any]]) -> None:
    if options.plots:
        document["plots"] = _plots(lambda: [plots.sweep_plot(out, summaries)], out)
    write_json_atomic(out / "sweep.json", document)


def _written(document: dict[str, Any], where: Path, write: Callable[[], None]) -> None:
    """Run `write`; a write that fails (a full disk, a read-only folder) is recorded in the document as
    `not_written` instead of losing the measurement (config_runs.fail_on_errors then ends the command with it)."""
    try:
        write()
    except OSError as exc:
        path = exc.filename or where
        document["not_written"] = {"path": str(path), "error": exc.strerror or str(exc)}
        warn(f"not written: {path}: {exc.strerror or exc}")


def raise_if_interrupted(document: dict[str, Any]) -> None:
    """run_bench stops sending on Ctrl-C/SIGTERM and returns what it measured (kept for the user); a caller that runs
    many benches (tune, the benchmark scripts) must stop too: KeyboardInterrupt when any point says it was interrupted."""
    if any(str(p.get("aborted") or "").startswith("interrupted") for p in document.get("points") or [document]):
        raise KeyboardInterrupt
