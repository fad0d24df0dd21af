"""`trtllm-forge bench`: load-test a deployed endpoint; `bench compare RUN_DIR...` puts runs side by side."""

from __future__ import annotations

from pathlib import Path

import click

from trtllm_forge.commands.deploy_cmd import DefaultCommandGroup
from trtllm_forge.commands.options import dry_run_option, json_option, load, workdir_option
from trtllm_forge.errors import ConfigError
from trtllm_forge.ui import emit_json

TARGETS = ("triton-grpc", "triton-grpc-tokens", "triton-http", "openai")


class BenchGroup(DefaultCommandGroup):
    default_command = "run"

    def format_usage(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        formatter.write_usage(ctx.command_path, "[run] [CONFIG] [OPTIONS] | compare RUN_DIR... | import FILE")


def _list(text: str | None, flag: str, kind=int) -> list:
    if not text:
        return []
    try:
        values = [kind(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(flag, f"{text!r} is not a comma-separated list of numbers", f"e.g. {flag} 1,4,16") from None
    if any(v <= 0 for v in values):
        raise ConfigError(flag, "values must be > 0", f"e.g. {flag} 1,4,16")
    return values


def _slo(items: tuple[str, ...]) -> dict[str, float]:
    slo = {}
    for item in items:
        key, _, value = item.partition(":")
        try:
            if key not in ("ttft", "tpot", "e2e"):
                raise ValueError
            slo[key] = float(value)
        except ValueError:
            raise ConfigError("--slo", f"{item!r} is not an SLO", "use ttft:MS, tpot:MS or e2e:MS (repeatable)") from None
    return slo


@click.group("bench", cls=BenchGroup, invoke_without_command=False)
def bench_group() -> None:
    """Load-test a deployed endpoint and report TTFT, TPOT, ITL, E2E, throughput and self-checks.

    \b
    trtllm-forge bench CONFIG                      the config's bench section against its deployment
    trtllm-forge bench --target triton-grpc --url 127.0.0.1:8001 --model ensemble --concurrency 1,8
    trtllm-forge bench CONFIG --tool perf_analyzer the same workload through NVIDIA's perf_analyzer (also genai-perf, aiperf)
    trtllm-forge bench import EXPORT... --out DIR  perf_analyzer / GenAI-Perf / AIPerf exports into our summary files
    trtllm-forge bench compare RUN_DIR RUN_DIR...  side-by-side table (and Pareto plot) of runs
    """


@bench_group.command("run")
@click.argument("config_file", metavar="[CONFIG]", required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--target", type=click.Choice(TARGETS), default=None, help="Endpoint kind. Default triton-grpc.")
@click.option("--url", default=None, help="gRPC host:port, or http://host:port for the HTTP targets. Default: the workdir's deployment.")
@click.option("--model", default=None, help="Model name (ensemble, tensorrt_llm_bls, tensorrt_llm; the served name for openai).")
@click.option("--concurrency", default=None, help="Closed-loop concurrencies, comma-separated (a sweep).")
@click.option("--request-rate", default=None, help="Open-loop request rates in requests/s, comma-separated (a sweep).")
@click.option("--arrival", type=click.Choice(["constant", "poisson", "gamma"]), default=None, help="Open-loop arrivals. Default poisson.")
@click.option("--burstiness", type=click.FloatRange(min=0, min_open=True), default=None, help="Gamma shape (1 = Poisson). Default 1.")
@click.option("--max-concurrency", type=click.IntRange(min=1), default=None, help="Cap on requests in flight in open loop.")
@click.option("--num-requests", type=click.IntRange(min=1), default=None, help="Measured requests per sweep point. Default 32.")
@click.option("--duration", type=click.FloatRange(min=0, min_open=True), default=None, help="Stop sending after S seconds per point.")
@click.option(
    "--warmup",
    "warmup_requests",
    type=click.IntRange(min=0),
    default=None,
    help="Warm-up requests (distinct prompts, excluded). Default 2.",
)
@click.option("--input-len", default=None, help="Prompt tokens: MEAN, MEAN:STD or LO..HI. Default 128.")
@click.option("--output-len", default=None, help="Output tokens: MEAN, MEAN:STD or LO..HI. Default 64.")
@click.option(
    "--dataset",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="JSONL {prompt|input_ids, output_tokens} or ShareGPT JSON.",
)
@click.option(
    "--tokenizer",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="HF tokenizer directory (exact prompt lengths, token counts).",
)
@click.option("--seed", type=int, default=None, help="Seed for prompts, lengths and arrivals (0 is a real seed). Default 0.")
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Output directory. Default <workdir>/bench/<workload> or ./bench-out.",
)
@click.option("--slo", multiple=True, help="Goodput SLO: ttft:MS, tpot:MS or e2e:MS (repeatable).")
@click.option("--metrics-url", default=None, help="Triton Prometheus URL to scrape. Default: the deployment's.")
@click.option("--workers", type=click.IntRange(min=1), default=1, show_default=True, help="Client processes to shard the load over.")
@click.option(
    "--streams",
    type=click.IntRange(min=1),
    default=None,
    help="gRPC streams (one connection each) to spread requests over. Default: one per request in flight, at most 64.",
)
@click.option(
    "--stall-timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=60.0,
    show_default=True,
    help="Abort a point when no request in flight has received anything for this many seconds.",
)
@click.option("--no-force-output-len", is_flag=True, help="Do not force the output length (min_tokens/end_id, ignore_eos).")
@click.option(
    "--request-timeout", type=click.FloatRange(min=0, min_open=True), default=600.0, show_default=True, help="Seconds per request."
)
@click.option(
    "--emit",
    type=click.Choice(["perf_analyzer", "genai-perf", "aiperf"]),
    multiple=True,
    help="Instead of running: write this workload's input file and exact command lines for another tool (repeatable).",
)
@click.option(
    "--tool",
    type=click.Choice(["perf_analyzer", "genai-perf", "aiperf"]),
    default=None,
    help="Run this tool instead of our client on the same workload (gRPC streaming), import its export and "
    "write our summary files, for `bench compare`. perf_analyzer is installed by `make setup`; "
    "genai-perf/aiperf are found on PATH or via FORGE_GENAI_PERF/FORGE_AIPERF.",
)
@click.option("--no-plots", is_flag=True, help="Skip the PNG plots.")
@click.option(
    "--openai-endpoint", type=click.Choice(["completions", "chat"]), default="completions", show_default=True, help="For --target openai."
)
@workdir_option
@dry_run_option
@json_option
def bench_run(
    config_file,
    target,
    url,
    model,
    concurrency,
    request_rate,
    arrival,
    burstiness,
    max_concurrency,
    num_requests,
    duration,
    warmup_requests,
    input_len,
    output_len,
    dataset,
    tokenizer,
    seed,
    out,
    slo,
    metrics_url,
    workers,
    streams,
    stall_timeout,
    no_force_output_len,
    request_timeout,
    emit,
    tool,
    no_plots,
    openai_endpoint,
    workdir,
    dry_run,
    as_json,
) -> None:
    """Run a benchmark (the default subcommand)."""
    from trtllm_forge.bench.config_runs import fail_on_errors, merge_options, options_from_config
    from trtllm_forge.bench.run import BenchOptions, run_bench
    from trtllm_forge.bench.workload import LengthSpec

    flags = dict(
        target=target,
        url=url,
        model=model,
        arrival=arrival,
        burstiness=burstiness,
        max_concurrency=max_concurrency,
        metrics_url=metrics_url,
        workers=workers,
        streams=streams,
        force_output_len=not no_force_output_len,
        request_timeout_s=request_timeout,
        stall_timeout_s=stall_timeout,
        openai_endpoint=openai_endpoint,
        plots=not no_plots,
    )
    load_flags = dict(
        concurrency=_list(concurrency, "--concurrency"),
        request_rate=_list(request_rate, "--request-rate", float),
        num_requests=num_requests,
        duration_s=duration,
        warmup_requests=warmup_requests,
        seed=seed,
        input_len=LengthSpec.parse(input_len, "--input-len") if input_len else None,
        output_len=LengthSpec.parse(output_len, "--output-len") if output_len else None,
        dataset=dataset,
        tokenizer=tokenizer,
        slo=_slo(slo),
    )
    if config_file is not None:
        flags["_emit"] = bool(emit)
        config, wd = load(config_file, workdir)
        runs = options_from_config(config, wd, flags, load_flags, out, str(config_file))
    else:
        if not url or not model:
            raise ConfigError("--url/--model", "needed without CONFIG", "give CONFIG (uses its deployment) or --url and --model")
        flags["target"] = flags["target"] or "triton-grpc"
        runs = [BenchOptions(**merge_options(flags, load_flags), out=out or Path("bench-out"))]
    if dry_run:
        from trtllm_forge.ui import info

        plan = [
            {
                **options.describe(),
                "points": [load.label for load in options.loads()],
                "files": [str(options.out / "<point>" / name) for name in ("summary.json", "summary.csv", "requests.jsonl", "*.png")],
            }
            for options in runs
        ]
        for item in plan:
            info(
                f"would run {item['target']} {item['model']} at {item['url']}: points {', '.join(item['points'])}; writes into {item['out']}"
            )
        if as_json:
            emit_json({"schema": "trtllm-forge.bench-plan/1", "dry_run": True, "runs": plan})
        return
    if emit:
        from trtllm_forge.bench.run import emit_workload

        document = {"schema": "trtllm-forge.bench-emit/1", "emitted": [emit_workload(options, kind) for options in runs for kind in emit]}
        if as_json:
            emit_json(document)
        return
    if tool:
        from trtllm_forge.bench.tool_runs import run_tool

        documents = [run_tool(options, tool) for options in runs]
        document = documents[0] if len(documents) == 1 else {"schema": "trtllm-forge.bench-workloads/1", "workloads": documents}
        if as_json:
            emit_json(document)
        fail_on_errors(documents)
        return
    documents = [run_bench(options) for options in runs]
    document = documents[0] if len(documents) == 1 else {"schema": "trtllm-forge.bench-workloads/1", "workloads": documents}
    if as_json:
        emit_json(document)
    fail_on_errors(documents)


@bench_group.command("import")
@click.argument("exports", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@click.option(
    "--out", type=click.Path(file_okay=False, path_type=Path), required=True, help="Write one run directory per export under here."
)
@click.option(
    "--tokenizer",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="HF tokenizer directory: counts the tokens of text responses in a perf_analyzer export.",
)
@json_option
def bench_import(exports, out, tokenizer, as_json) -> None:
    """Convert other tools' exports into our summary files, so `bench compare` shows them beside our runs:
    perf_analyzer's profile_export.json, AIPerf's profile_export_aiperf.json/.csv (both schemas) and
    profile_export.jsonl, GenAI-Perf's profile_export_genai_perf.json/.csv and analyze_export_genai_perf.csv
    (or a folder holding one). Anything else exits 2 naming the file."""
    import json
    import os

    from trtllm_forge.bench.exports import import_export
    from trtllm_forge.bench.tool_runs import write_point
    from trtllm_forge.bench.workload import load_tokenizer
    from trtllm_forge.ui import info

    tok = load_tokenizer(tokenizer)
    imported = [(export, import_export(export, tok)) for export in exports]  # every file read before anything is written
    written = []
    for index, (export, points) in enumerate(imported):
        run_dir = out / f"{index:02d}-{points[0].summary['source']}-{Path(export).stem}"
        if len(points) == 1:
            write_point(run_dir, points[0].summary, points[0].records)
        else:
            summaries = []
            for k, point in enumerate(points):
                load = point.summary.get("load") or {}
                label = point.summary.get("config_name") or f"{k:02d}-{load.get('mode', 'point')}{load.get('value', k)}"
                write_point(run_dir / label, point.summary, point.records)
                summaries.append(point.summary)
            run_dir.mkdir(parents=True, exist_ok=True)
            tmp = run_dir / "sweep.json.tmp"
            tmp.write_text(
                json.dumps(
                    {"schema": "trtllm-forge.bench-sweep/1", "points": summaries, "source": points[0].summary["source"]},
                    indent=2,
                    default=str,
                )
                + "\n"
            )
            os.replace(tmp, run_dir / "sweep.json")
        info(f"imported {export} ({points[0].summary['source']}, {len(points)} point(s)) -> {run_dir}")
        written.append(str(run_dir))
    if as_json:
        emit_json({"schema": "trtllm-forge.bench-import/1", "runs": written})


@bench_group.command("compare")
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option(
    "--out", type=click.Path(file_okay=False, path_type=Path), default=None, help="Write compare.json, compare.csv and pareto.png here."
)
@json_option
def bench_compare(run_dirs, out, as_json) -> None:
    """Put several runs side by side: ours, `bench --tool` runs, `bench import` outputs or raw tool exports."""
    from trtllm_forge.bench.compare import compare_runs

    document = compare_runs(list(run_dirs), out)
    if as_json:
        emit_json(document)
