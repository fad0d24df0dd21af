"""Benchmark runs described by a config's `bench` section and its deployment in the workdir."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from trtllm_forge.bench.options import BenchOptions
from trtllm_forge.config.schema import BenchWorkload, ForgeConfig
from trtllm_forge.errors import ConfigError, StepError
from trtllm_forge.importer.stage import imported_checkpoint

if TYPE_CHECKING:
    from trtllm_forge.deploy.kinds import Deployment


def merge_options(flags: dict, load_flags: dict | None = None, base: dict | None = None) -> dict:
    """`base` (a workload's options) with the options given on the command line over it; not given = None or empty."""
    given = {**flags, **(load_flags or {})}
    merged = dict(base or {})
    for key, value in given.items():
        if value is None or value == [] or value == {}:
            continue
        merged[key] = value
    if given.get("output_len") is not None:
        merged["output_len_given"] = True
    return merged


def options_from_config(
    config: ForgeConfig,
    wd: Path,
    flags: dict,
    load_flags: dict | None = None,
    out: Path | None = None,
    config_label: str = "CONFIG",
    *,
    emit: bool = False,
    deployment: Deployment | None = None,
) -> list[BenchOptions]:
    """One BenchOptions per workload of the config's bench section; options given on the command line win.

    `flags` (and `load_flags`, merged with it) hold the command line's options by BenchOptions field
    (bench/options.py `from_command_line`); `emit`: only commands are written, so no running deployment is needed.
    `deployment`: the server to measure (`run` passes the one it started); None reads the one deploy.server's kind
    recorded in the workdir. The kind gives a workload's default target and refuses targets it does not serve."""
    from trtllm_forge.bench.options import from_workload
    from trtllm_forge.deploy.kinds import kind_of

    flags = {**flags, **(load_flags or {})}
    kind = kind_of(config)
    state = deployment if deployment is not None else kind.read(wd)
    names = config.triton.model_names
    checkpoint = imported_checkpoint(wd)
    workloads: list[BenchWorkload | None] = [*config.bench.workloads] or [None]
    cli_load = bool(flags.get("concurrency") or flags.get("request_rate"))
    runs = []
    for workload in workloads:
        base: dict = {"tokenizer": checkpoint if checkpoint and (checkpoint / "tokenizer_config.json").is_file() else None}
        name = "default"
        if workload is not None:
            name = workload.name
            base.update(from_workload(workload, f"bench.workloads[{name}]"))
            if base["request_rate"] and "concurrency" not in workload.model_fields_set:
                base["concurrency"] = []  # rates only: the default concurrency [1] is not swept too
            base["output_len_given"] = "output_len" in workload.model_fields_set
        given = workload is not None and "target" in workload.model_fields_set
        target: str = flags.get("target") or (base.get("target") if given else None) or kind.default_bench_target
        if not kind.serves_bench_target(target) and not flags.get("url"):
            raise ConfigError(
                "--target", f"{target!r} is not served by deploy.server {kind.name}", f"use --target {kind.default_bench_target}"
            )
        run_flags = {**flags, "target": target}
        grpc = target.startswith("triton-grpc")
        if not run_flags.get("url"):
            if state is not None and state.running:
                run_flags["url"] = state.grpc_url if grpc else state.http_url
                run_flags["metrics_url"] = run_flags.get("metrics_url") or state.metrics_url
                run_flags["http_url"] = state.http_url
                pgid, repository = getattr(state, "pgid", None), getattr(state, "repository", None)
                if pgid and repository:  # a Triton deployment: a stall asks its python stubs
                    run_flags["server_stubs"] = (pgid, str(repository))
            elif emit:
                t = config.triton
                run_flags["url"] = f"127.0.0.1:{t.grpc_port}" if grpc else f"http://127.0.0.1:{t.http_port}"
                run_flags["http_url"] = f"http://127.0.0.1:{t.http_port}"
            else:
                raise StepError(
                    "bench", f"no running deployment in {wd}", f"run `trtllm-forge deploy {config_label}` first, or pass --url and --model"
                )
        if not run_flags.get("model") and state is not None and state.served_model:
            run_flags["model"] = state.served_model  # an OpenAI server names the model its own way
        if not run_flags.get("model"):
            from trtllm_forge.entrypoint import entry_model

            run_flags["model"] = names.tensorrt_llm if target == "triton-grpc-tokens" else entry_model(config)
        if cli_load:  # a load given on the command line replaces the workload's whole sweep
            base["concurrency"], base["request_rate"] = [], []
        merged = merge_options(run_flags, None, base)
        runs.append(BenchOptions(**merged, out=out / name if (out and len(workloads) > 1) else (out or wd / "bench" / name)))
    return runs


def fail_on_errors(documents: list[dict]) -> None:
    points = [p for d in documents for p in (d.get("points") or [d])]
    unwritten = next((d["not_written"] for d in [*documents, *points] if d.get("not_written")), None)
    if unwritten:
        raise StepError(
            "bench --out",
            f"could not write {unwritten['path']}: {unwritten['error']}",
            "free space there or pass another --out; the measured summary was printed above (and by --json)",
        )
    failed = sum(p["requests"]["failed"] for p in points)
    aborted = next((p["aborted"] for p in points if p.get("aborted")), None)
    if aborted and not failed:
        raise StepError("bench", f"stopped early: {aborted}", f"records and summary of what completed are in {points[-1]['out_dir']}")
    if failed:
        sent = sum(p["requests"]["sent"] for p in points)
        kinds: dict[str, int] = {}
        for p in points:
            for k, v in p["requests"]["errors_by_kind"].items():
                kinds[k] = kinds.get(k, 0) + v
        detail = ", ".join(f"{k}: {v}" for k, v in kinds.items())
        raise StepError(
            "bench",
            f"{failed} of {sent} requests failed ({detail})",
            f"records and summary of what completed are in {points[-1]['out_dir']}",
        )
