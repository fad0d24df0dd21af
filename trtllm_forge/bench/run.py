"""One `bench` invocation: build the workload, open the target, run each sweep point, write the outputs."""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from trtllm_forge import __version__
from trtllm_forge.bench import report, server_metrics
from trtllm_forge.bench.metrics import summarize
from trtllm_forge.bench.runner import LoadSpec, run_load
from trtllm_forge.bench.target import Target
from trtllm_forge.bench.workload import BenchRequest, LengthSpec, from_dataset, load_tokenizer, synthetic, take
from trtllm_forge.errors import ConfigError
from trtllm_forge.ui import info

TARGETS = ("triton-grpc", "triton-grpc-tokens", "triton-http", "openai")


@dataclass
class BenchOptions:
    target: str
    url: str
    model: str
    concurrency: list[int] = field(default_factory=list)
    request_rate: list[float] = field(default_factory=list)
    arrival: str = "poisson"
    burstiness: float = 1.0
    max_concurrency: int | None = None
    num_requests: int = 32
    duration_s: float | None = None
    warmup_requests: int = 2
    input_len: LengthSpec = field(default_factory=lambda: LengthSpec(128))
    output_len: LengthSpec = field(default_factory=lambda: LengthSpec(64))
    output_len_given: bool = False
    dataset: Path | None = None
    tokenizer: Path | None = None
    seed: int = 0
    out: Path = Path("bench-out")
    slo: dict[str, float] = field(default_factory=dict)
    metrics_url: str | None = None
    streams: int = 1
    force_output_len: bool = True
    request_timeout_s: float = 600.0
    openai_endpoint: str = "completions"

    def loads(self) -> list[LoadSpec]:
        common = dict(num_requests=self.num_requests, duration_s=self.duration_s, warmup_requests=self.warmup_requests)
        points = [LoadSpec("concurrency", c, **common) for c in self.concurrency]
        points += [LoadSpec("rate", r, self.arrival, self.burstiness, self.max_concurrency, **common) for r in self.request_rate]
        return points or [LoadSpec("concurrency", 1, **common)]

    def describe(self) -> dict:
        data = {k: (str(v) if isinstance(v, Path) else v) for k, v in self.__dict__.items()}
        data["input_len"] = self.input_len.describe()
        data["output_len"] = self.output_len.describe()
        return data


def make_target(options: BenchOptions, tokenizer) -> Target:
    kwargs = dict(tokenizer=tokenizer, force_output_len=options.force_output_len, request_timeout=options.request_timeout_s)
    if options.target in ("triton-grpc", "triton-grpc-tokens"):
        from trtllm_forge.bench.target_grpc import TritonGrpcTarget, TritonGrpcTokensTarget

        cls = TritonGrpcTarget if options.target == "triton-grpc" else TritonGrpcTokensTarget
        return cls(options.url, options.model, streams=options.streams, **kwargs)
    from trtllm_forge.bench.target_http import OpenAITarget, TritonHttpTarget

    if options.target == "triton-http":
        return TritonHttpTarget(options.url, options.model, **kwargs)
    return OpenAITarget(options.url, options.model, endpoint=options.openai_endpoint, **kwargs)


def build_requests(options: BenchOptions, tokenizer, n: int, rng: np.random.Generator) -> list[BenchRequest]:
    if options.dataset is not None:
        pool = from_dataset(options.dataset, tokenizer, options.output_len if options.output_len_given else None, rng)
        return take(pool, n, rng)
    return synthetic(n, options.input_len, options.output_len, rng, tokenizer)


def _versions() -> dict:
    import grpc
    import tritonclient

    return {"trtllm_forge": __version__, "tritonclient": getattr(tritonclient, "__version__", "?"), "grpcio": grpc.__version__}


async def _run_all(options: BenchOptions, tokenizer) -> list[tuple[LoadSpec, dict, list]]:
    target = make_target(options, tokenizer)
    await target.open()
    results = []
    try:
        for index, load in enumerate(options.loads()):
            rng = np.random.default_rng([options.seed, index])
            # Without a duration every point sends exactly num_requests; with one, enough to never run dry.
            n = options.num_requests if load.duration_s is None else max(options.num_requests, int(load.duration_s * (load.value if load.mode == "rate" else 200) * 2) + 16)
            requests = build_requests(options, tokenizer, n, rng)
            warmup = build_requests(options, tokenizer, options.warmup_requests, np.random.default_rng([options.seed, index, 1])) if options.warmup_requests else []
            info(f"bench {options.target} {options.model}: {load.label} ({len(requests) if load.duration_s is None else f'{load.duration_s:g} s'}), warm-up {len(warmup)}")
            before = server_metrics.scrape(options.metrics_url)
            with server_metrics.Sampler(options.metrics_url) as sampler:
                result = await run_load(target, requests, warmup, load, options.seed)
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


def run_bench(options: BenchOptions) -> dict:
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
        report.write_point(point_dir, summary, records)
        report.print_point(summary, f"{options.target} {options.model} {load.label}")
        summaries.append(summary)
    if not multi:
        return summaries[0]
    report.print_sweep(summaries)
    document = {"schema": "trtllm-forge.bench-sweep/1", "points": summaries, "out_dir": str(out)}
    tmp = out / "sweep.json.tmp"
    tmp.write_text(json.dumps(document, indent=2, sort_keys=True, default=str) + "\n")
    os.replace(tmp, out / "sweep.json")
    return document
