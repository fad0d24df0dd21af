#!/usr/bin/env python3
"""The LLM API path on CPU beside the engine path: three deployments of the same SmolLM2-135M OpenVINO IR,
measured by our bench with one workload, interleaved and repeated.

  engine     the engine-path Triton repository: ensemble → preprocessing → CPU `tensorrt_llm` model
             (OpenVINO GenAI continuous batching) → postprocessing; target triton-grpc
  llmapi     the llmapi Triton repository: NVIDIA's llmapi `model.py` on the CPU LLM-API stand-in
             (trtllm_forge.llmapi_cpu, not TensorRT-LLM); target triton-grpc (sampling_param_* tensors)
  serve      `trtllm-serve` on CPU: the stand-in's OpenAI-compatible server (the same argv as trtllm-serve);
             target openai, /v1/completions

All three servers run at once (idle while another is measured); for each repeat and concurrency the three are
measured back to back, in an order rotated per repeat, so every comparison is between runs taken minutes apart,
never between runs taken at different times. Ratios are taken within a repeat, then the median over repeats.

Writes results/llmapi_cpu/run-<UTC>.json (git commit, machine with CPU model and cores, load average, every
run) and, with --readme, regenerates the README table between the `llmapi-cpu-table` markers from the newest
file (`render_llmapi_table(results_dir)`).

    .venv/bin/python scripts/bench_llmapi_cpu.py [--repeats 3] [--concurrency 1,8] [--note "..."] [--readme]
    .venv/bin/python scripts/bench_llmapi_cpu.py --readme-only     # the table from the committed files
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtllm_forge.bench.provenance import git_commit, machine, measured_where, utc_now

REPO = Path(__file__).resolve().parent.parent
RESULTS_DIR = REPO / "results" / "llmapi_cpu"
README = REPO / "docs" / "benchmarks" / "llmapi-cpu.md"  # the page holding the block (scripts/readme_tables.py regenerates all)
MARKERS = ("<!-- llmapi-cpu-table:start -->", "<!-- llmapi-cpu-table:end -->")
SCHEMA = "trtllm-forge.bench-llmapi-cpu/1"
PATHS = ("engine", "llmapi", "serve")
PATH_LABELS = {
    "engine": "engine path: Triton ensemble → CPU `tensorrt_llm` model",
    "llmapi": "LLM API path: Triton `llmapi` model on the stand-in",
    "serve": "LLM API path: `trtllm-serve` (stand-in), OpenAI `/v1/completions`",
}
METRICS = (("ttft_ms", "p50"), ("tpot_ms", "p50"), ("itl_ms", "p50"), ("e2e_ms", "p50"))


@dataclass
class Endpoint:
    """One deployment under test: how the bench reaches it, and how to stop it."""

    path: str
    target: str
    url: str
    model: str
    stop: Callable[[], None]


def _free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _configs() -> tuple[Any, Any]:
    """The shipped engine-path and llmapi CPU configs with free ports (their engine and KV settings are equal)."""
    from trtllm_forge.config import ForgeConfig, load_config

    configs = []
    for name in ("smollm2-cpu.yaml", "smollm2-cpu-llmapi.yaml"):
        data = load_config(REPO / "configs" / name).model_dump(mode="json")
        data["triton"].update(http_port=0, grpc_port=0, metrics_port=0, bind_address="127.0.0.1")
        data["bench"]["workloads"] = []
        configs.append(ForgeConfig.model_validate({**data, "config_dir": str(REPO / "configs")}))
    engine, llmapi = configs
    for key in ("engine", "runtime", "quantization"):
        a, b = engine.model_dump()[key], llmapi.model_dump()[key]
        differing = {k for k in a if a[k] != b[k]} - {"target", "exclude_input_in_output"}
        if differing:
            raise SystemExit(f"configs differ in {key}: {sorted(differing)}; the comparison needs equal engines")
    return engine, llmapi


def prepare(workdir: Path) -> tuple[Any, Any, Path, Any, Any]:
    """Import once, build both (cached when unchanged), render both repositories."""
    from trtllm_forge.builders.openvino.builder import build_engine

    from trtllm_forge.importer.stage import import_checkpoint
    from trtllm_forge.render.repository import render_repository

    engine_cfg, llmapi_cfg = _configs()
    checkpoint = import_checkpoint(engine_cfg, workdir / "engine").checkpoint_dir
    engine_build = build_engine(engine_cfg, workdir / "engine", checkpoint)
    llmapi_build = build_engine(llmapi_cfg, workdir / "llmapi", checkpoint)
    render_repository(engine_cfg, workdir / "engine", engine_build.engine_dir)
    render_repository(llmapi_cfg, workdir / "llmapi", llmapi_build.engine_dir)
    return engine_cfg, llmapi_cfg, checkpoint, engine_build, llmapi_build


def start_endpoints(stack: ExitStack, workdir: Path, engine_cfg: Any, llmapi_cfg: Any, llmapi_build: Any) -> list[Endpoint]:
    from trtllm_forge.deploy import trtllm_serve
    from trtllm_forge.deploy.server import start_server, stop_server
    from trtllm_forge.entrypoint import entry_model

    endpoints = []
    for path, config in (("engine", engine_cfg), ("llmapi", llmapi_cfg)):
        repository = workdir / path / "render" / "model_repository"
        deployment = start_server(config, workdir / path, repository, die_with_caller=True)
        stack.callback(stop_server, deployment, quiet=True)
        endpoints.append(Endpoint(path, "triton-grpc", deployment.grpc_url, entry_model(config), lambda: None))
    model = str(llmapi_build.engine_dir)
    options = trtllm_serve.options_file_for(llmapi_build.llmapi_dir)
    port = _free_port()
    argv = trtllm_serve.serve_argv(llmapi_cfg, model, str(options), host="127.0.0.1", port=port)
    server = trtllm_serve.start_local(argv, f"http://127.0.0.1:{port}", workdir / "serve" / "trtllm-serve.log", die_with_caller=True)
    stack.callback(server.stop)
    endpoints.append(Endpoint("serve", "openai", server.url, model, server.stop))
    return endpoints


def measure(endpoint: Endpoint, concurrency: int, args: argparse.Namespace, checkpoint: Path, out: Path) -> dict[str, Any]:
    """One bench run (our load generator, in this process) and the numbers the table needs."""
    from trtllm_forge.bench.run import BenchOptions, raise_if_interrupted, run_bench
    from trtllm_forge.bench.specs import LengthSpec

    options = BenchOptions(
        target=endpoint.target,
        url=endpoint.url,
        model=endpoint.model,
        concurrency=[concurrency],
        num_requests=requests_per_run(args, concurrency),
        warmup_requests=min(concurrency, 4),
        input_len=LengthSpec(args.input_len),
        output_len=LengthSpec(args.output_len),
        tokenizer=checkpoint,
        seed=args.seed,
        out=out,
        plots=False,
        request_timeout_s=600.0,
    )
    started = time.time()
    document = run_bench(options)
    raise_if_interrupted(document)  # Ctrl-C/SIGTERM stop the script, not just this bench
    point = (document.get("points") or [document])[0]
    metrics = point["metrics"]
    row: dict[str, Any] = {
        "path": endpoint.path,
        "target": endpoint.target,
        "concurrency": concurrency,
        "completed": point["requests"]["completed"],
        "failed": point["requests"]["failed"],
        "wall_s": round(time.time() - started, 2),
        "load_average_after": os.getloadavg()[0],
    }
    for name, stat in METRICS:
        row[f"{name}_{stat}"] = (metrics.get(name) or {}).get(stat)
    row["output_token_throughput_per_s"] = (metrics.get("output_token_throughput_per_s") or {}).get("avg")
    row["request_throughput_per_s"] = (metrics.get("request_throughput_per_s") or {}).get("avg")
    row["output_tokens_avg"] = (metrics.get("output_tokens") or {}).get("avg")
    checks = point.get("self_checks") or {}
    row["osl_mismatch_count"] = checks.get("osl_mismatch_count")
    row["forced_output_len"] = (point.get("target") or {}).get("forced_output_len")
    return row


def write_atomic(document: dict[str, Any], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(document, indent=2) + "\n")
    os.replace(tmp, out)


def requests_per_run(args: argparse.Namespace, concurrency: int) -> int:
    return max(args.requests, 2 * concurrency)


def run(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """Measure and write `out` after every run (a killed run keeps what it measured; `finished_utc` marks a whole one)."""
    workdir = args.workdir.resolve()
    engine_cfg, llmapi_cfg, checkpoint, engine_build, llmapi_build = prepare(workdir)
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    document: dict[str, Any] = {
        "schema": SCHEMA,
        "git_commit": git_commit(),
        "machine": machine(),
        "started_utc": utc_now(),
        "workload": {
            "input_tokens": args.input_len,
            "output_tokens": args.output_len,
            "concurrency": concurrencies,
            "requests_per_run": {str(c): requests_per_run(args, c) for c in concurrencies},
            "seed": args.seed,
            "prompts": "synthetic (random token ids, decoded and re-encoded to the exact length)",
        },
        "engine": {
            "config": "configs/smollm2-cpu.yaml and configs/smollm2-cpu-llmapi.yaml (free ports)",
            "engine_dir": {"engine": str(engine_build.engine_dir), "llmapi": str(llmapi_build.engine_dir)},
            "precision": engine_cfg.engine.cpu_inference_precision,
            "max_batch_size": engine_cfg.engine.max_batch_size,
        },
        "paths": {p: PATH_LABELS[p] for p in PATHS},
        "repeats": args.repeats,
        "runs": [],
    }
    if args.note:
        document["note"] = args.note
    with ExitStack() as stack, tempfile.TemporaryDirectory(prefix="bench-llmapi-cpu-") as tmp:
        endpoints = start_endpoints(stack, workdir, engine_cfg, llmapi_cfg, llmapi_build)
        for repeat in range(args.repeats):
            for concurrency in concurrencies:
                shift = repeat % len(endpoints)
                for endpoint in endpoints[shift:] + endpoints[:shift]:  # rotate who goes first
                    try:
                        row = measure(endpoint, concurrency, args, checkpoint, Path(tmp) / f"{endpoint.path}-{repeat}-c{concurrency}")
                    except Exception as exc:
                        row = {"path": endpoint.path, "concurrency": concurrency, "error": f"{type(exc).__name__}: {exc}"}
                    row["repeat"] = repeat
                    document["runs"].append(row)
                    write_atomic(document, out)
                    print(json.dumps(row), flush=True)
    document["finished_utc"] = utc_now()
    document["machine"]["load_average_end"] = list(os.getloadavg())
    write_atomic(document, out)
    return document


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def newest_result(results_dir: Path) -> dict[str, Any]:
    files = sorted(Path(results_dir).glob("run-*.json"))
    if not files:
        raise SystemExit(f"no run-*.json in {results_dir}: run scripts/bench_llmapi_cpu.py first")
    return json.loads(files[-1].read_text())


def render_llmapi_table(results_dir: Path) -> str:
    """Markdown for the README from the newest committed result: per concurrency and path, medians over the
    repeats, and each path's output tokens/s against the engine path's from the same repeat."""
    document = newest_result(results_dir)
    runs = [r for r in document["runs"] if "error" not in r]
    work = document["workload"]
    lines = [
        f"Workload: {work['input_tokens']} prompt tokens → {work['output_tokens']} output tokens, greedy, "
        f"{'/'.join(str(c) for c in work['concurrency'])} concurrent; median of {document['repeats']} interleaved repeats; "
        + measured_where(document)
        + ("" if document.get("finished_utc") else f"; INCOMPLETE: stopped after {len(document['runs'])} runs"),
        "",
        "| concurrency | path | runs | TTFT p50 (ms) | TPOT p50 (ms) | ITL p50 (ms) | E2E p50 (ms) | output tok/s | vs engine path | output tokens |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    errors = [r for r in document["runs"] if "error" in r]
    for concurrency in work["concurrency"]:
        engine_by_repeat = {
            r["repeat"]: r["output_token_throughput_per_s"] for r in runs if r["path"] == "engine" and r["concurrency"] == concurrency
        }
        for path in PATHS:
            rows = [r for r in runs if r["path"] == path and r["concurrency"] == concurrency]
            if not rows:
                continue
            cells = [str(concurrency), document["paths"][path], str(len(rows))]
            for name, stat in METRICS:
                cells.append(_fmt(_median([r[f"{name}_{stat}"] for r in rows if r.get(f"{name}_{stat}") is not None])))
            cells.append(_fmt(_median([r["output_token_throughput_per_s"] for r in rows if r.get("output_token_throughput_per_s")])))
            ratios = [
                r["output_token_throughput_per_s"] / engine_by_repeat[r["repeat"]]
                for r in rows
                if r.get("output_token_throughput_per_s") and engine_by_repeat.get(r["repeat"])
            ]
            ratio = _median(ratios)
            cells.append("-" if ratio is None else f"{ratio:.2f}×")
            cells.append(_fmt(_median([r["output_tokens_avg"] for r in rows if r.get("output_tokens_avg") is not None])))
            lines.append("| " + " | ".join(cells) + " |")
    if errors:
        lines += ["", f"{len(errors)} run(s) failed: " + "; ".join(f"{e['path']} c{e['concurrency']}: {e['error']}" for e in errors)]
    return "\n".join(lines) + "\n"


def update_readme(results_dir: Path, readme: Path = README) -> None:
    text = readme.read_text()
    start, end = MARKERS
    if start not in text or end not in text:
        raise SystemExit(f"{readme} has no {start} ... {end} block")
    before, rest = text.split(start, 1)
    _, after = rest.split(end, 1)
    readme.write_text(before + start + "\n" + render_llmapi_table(results_dir) + end + after)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--concurrency", default="1,8")
    parser.add_argument("--input-len", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--requests", type=int, default=4, help="measured requests per run (at least 2 x concurrency)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workdir", type=Path, default=REPO / "forge-work" / "bench-llmapi-cpu", help="import/build/render cache")
    parser.add_argument("--note", default=None, help="a note stored with the results (e.g. that the machine was busy)")
    parser.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument("--readme", action="store_true", help="regenerate the README table from the newest result file")
    parser.add_argument("--readme-only", action="store_true", help="regenerate the README table; run nothing")
    args = parser.parse_args()
    if not args.readme_only:
        out = args.out_dir / f"run-{utc_now().replace(':', '')}.json"
        run(args, out)
        print(f"wrote {out}")
        print(render_llmapi_table(args.out_dir))
    if args.readme or args.readme_only:
        update_readme(args.out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
