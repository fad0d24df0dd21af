"""`trtllm-forge bench`: load-test a deployed endpoint; `bench compare RUN_DIR...` puts runs side by side."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from trtllm_forge.atomic_files import write_json_atomic
from trtllm_forge.bench import options as bench_options
from trtllm_forge.bench.tools.registry import NAMES as TOOL_NAMES
from trtllm_forge.commands.deploy_cmd import DefaultCommandGroup
from trtllm_forge.commands.options import directory_option, dry_run_option, json_option, load, optional_config_argument, workdir_option
from trtllm_forge.errors import ConfigError
from trtllm_forge.ui import emit_json


class BenchGroup(DefaultCommandGroup):
    default_command = "run"

    def format_usage(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        formatter.write_usage(ctx.command_path, "[run] [CONFIG] [OPTIONS] | compare RUN_DIR... | import FILE")


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
@optional_config_argument
@bench_options.click_options(
    insert_before={
        "plots": [
            click.option(
                "--emit",
                type=click.Choice(TOOL_NAMES),
                multiple=True,
                help="Instead of running: write this workload's input file and exact command lines for another tool (repeatable).",
            ),
            click.option(
                "--tool",
                type=click.Choice(TOOL_NAMES),
                default=None,
                help="Run this tool instead of our client on the same workload (gRPC streaming), import its export and "
                "write our summary files, for `bench compare`. perf_analyzer is installed by `make setup`; "
                "genai-perf/aiperf are found on PATH or via FORGE_GENAI_PERF/FORGE_AIPERF.",
            ),
        ]
    }
)
@workdir_option
@dry_run_option
@json_option
def bench_run(
    config_file: Path | None,
    emit: tuple[str, ...],
    tool: str | None,
    workdir: Path | None,
    dry_run: bool,
    as_json: bool,
    **flags: Any,
) -> None:
    """Run a benchmark (the default subcommand)."""
    from trtllm_forge.bench.config_runs import fail_on_errors, merge_options, options_from_config
    from trtllm_forge.bench.run import BenchOptions, run_bench

    given = bench_options.from_command_line(flags)  # the options given on the command line, by BenchOptions field
    out = given.pop("out", None)
    if config_file is not None:
        config, wd = load(config_file, workdir)
        runs = options_from_config(config, wd, given, None, out, str(config_file), emit=bool(emit))
    else:
        if not given.get("url") or not given.get("model"):
            raise ConfigError("--url/--model", "needed without CONFIG", "give CONFIG (uses its deployment) or --url and --model")
        runs = [BenchOptions(**merge_options(given, {}), out=out or Path("bench-out"))]
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
        from trtllm_forge.bench.tool_runs import emit_workload

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
@directory_option("--out", help="Write one run directory per export under here.", required=True)
@directory_option("--tokenizer", help="HF tokenizer directory: counts the tokens of text responses in a perf_analyzer export.")
@json_option
def bench_import(exports: tuple[Path, ...], out: Path, tokenizer: Path | None, as_json: bool) -> None:
    """Convert other tools' exports into our summary files, so `bench compare` shows them beside our runs:
    perf_analyzer's profile_export.json, AIPerf's profile_export_aiperf.json/.csv (both schemas) and
    profile_export.jsonl, GenAI-Perf's profile_export_genai_perf.json/.csv and analyze_export_genai_perf.csv
    (or a folder holding one). Anything else exits 2 naming the file."""

    from trtllm_forge.bench.exports import import_export, write_point
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
            write_json_atomic(
                run_dir / "sweep.json", {"schema": "trtllm-forge.bench-sweep/1", "points": summaries, "source": points[0].summary["source"]}
            )
        info(f"imported {export} ({points[0].summary['source']}, {len(points)} point(s)) -> {run_dir}")
        written.append(str(run_dir))
    if as_json:
        emit_json({"schema": "trtllm-forge.bench-import/1", "runs": written})


@bench_group.command("compare")
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False, path_type=Path))
@directory_option("--out", help="Write compare.json, compare.csv and pareto.png here.")
@json_option
def bench_compare(run_dirs: tuple[Path, ...], out: Path | None, as_json: bool) -> None:
    """Put several runs side by side: ours, `bench --tool` runs, `bench import` outputs or raw tool exports."""
    from trtllm_forge.bench.compare import compare_runs

    document = compare_runs(list(run_dirs), out)
    if as_json:
        emit_json(document)
