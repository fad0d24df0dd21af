"""Benchmark runs described by a config's `bench` section and its deployment in the workdir."""

from __future__ import annotations

from pathlib import Path

from trtllm_forge.config.schema import ForgeConfig
from trtllm_forge.errors import StepError
from trtllm_forge.importer.stage import imported_checkpoint


def merge_options(flags: dict, load_flags: dict, base: dict | None = None) -> dict:
    merged = dict(base or {})
    for key, value in {**flags, **load_flags}.items():
        if value is None or value == [] or value == {}:
            continue
        merged[key] = value
    if "output_len" in load_flags and load_flags["output_len"] is not None:
        merged["output_len_given"] = True
    return merged


def options_from_config(
    config: ForgeConfig, wd: Path, flags: dict, load_flags: dict, out: Path | None, config_label: str = "CONFIG"
) -> list:
    """One BenchOptions per workload of the config's bench section; flags given on the command line win."""
    from trtllm_forge.bench.run import BenchOptions
    from trtllm_forge.bench.workload import LengthSpec
    from trtllm_forge.deploy.state import read_state

    state = read_state(wd)
    running = state is not None and state.running
    emit = flags.pop("_emit", False)
    names = config.triton.model_names
    checkpoint = imported_checkpoint(wd)
    workloads = config.bench.workloads or [None]
    cli_load = bool(load_flags.get("concurrency") or load_flags.get("request_rate"))
    runs = []
    for workload in workloads:
        served_by_openai = config.deploy.server == "trtllm-serve"  # trtllm-serve speaks OpenAI only
        default_target = "openai" if served_by_openai else "triton-grpc"
        given = workload is not None and "target" in workload.model_fields_set
        target = flags.get("target") or (workload.target if given else default_target)
        run_flags = {**flags, "target": target}
        grpc = target.startswith("triton-grpc")
        if not run_flags.get("url") and target == "openai":
            from trtllm_forge.deploy.trtllm_serve import served_url

            run_flags["url"] = served_url(wd)  # a local trtllm-serve of this workdir, if one runs
        if not run_flags.get("url"):
            if running:
                run_flags["url"] = state.grpc_url if grpc else state.http_url
                run_flags["metrics_url"] = run_flags.get("metrics_url") or state.metrics_url
                run_flags["http_url"] = state.http_url
            elif emit:
                t = config.triton
                run_flags["url"] = f"127.0.0.1:{t.grpc_port}" if grpc else f"http://127.0.0.1:{t.http_port}"
                run_flags["http_url"] = f"http://127.0.0.1:{t.http_port}"
            else:
                raise StepError(
                    "bench", f"no running deployment in {wd}", f"run `trtllm-forge deploy {config_label}` first, or pass --url and --model"
                )
        if not run_flags.get("model") and target == "openai":
            from trtllm_forge.deploy.trtllm_serve import served_model

            run_flags["model"] = served_model(wd)
        if not run_flags.get("model"):
            from trtllm_forge.entrypoint import entry_model

            run_flags["model"] = names.tensorrt_llm if target == "triton-grpc-tokens" else entry_model(config)
        base: dict = {"tokenizer": checkpoint if checkpoint and (checkpoint / "tokenizer_config.json").is_file() else None}
        name = "default"
        if workload is not None:
            name = workload.name
            where = f"bench.workloads[{name}]"
            rates_only = workload.request_rate and "concurrency" not in workload.model_fields_set
            base.update(
                concurrency=[] if rates_only else list(workload.concurrency),
                request_rate=list(workload.request_rate),
                arrival=workload.arrival,
                num_requests=workload.num_requests,
                duration_s=workload.duration_s,
                warmup_requests=workload.warmup_requests,
                seed=workload.seed,
                slo=dict(workload.slo_ms),
                input_len=LengthSpec.parse(workload.input_len, f"{where}.input_len"),
                output_len=LengthSpec.parse(workload.output_len, f"{where}.output_len"),
                output_len_given="output_len" in workload.model_fields_set,
                dataset=Path(workload.dataset) if workload.dataset else None,
            )
        if cli_load:  # a load given on the command line replaces the workload's whole sweep
            base["concurrency"], base["request_rate"] = [], []
        merged = merge_options(run_flags, load_flags, base)
        runs.append(BenchOptions(**merged, out=out / name if (out and len(workloads) > 1) else (out or wd / "bench" / name)))
    return runs


def fail_on_errors(documents: list[dict]) -> None:
    points = [p for d in documents for p in (d.get("points") or [d])]
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
