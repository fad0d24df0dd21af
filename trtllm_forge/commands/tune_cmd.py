"""`trtllm-forge tune`: the serving configuration with the most goodput under latency goals, measured."""

from __future__ import annotations

from pathlib import Path

import click

from trtllm_forge.commands.options import DIRECTORY, FILE, config_argument, dry_run_option, json_option, load, workdir_option
from trtllm_forge.errors import ConfigError
from trtllm_forge.ui import emit_json, info


def _concurrencies(text: str | None) -> tuple[int, ...] | None:
    if not text:
        return None
    try:
        values = tuple(sorted({int(x) for x in text.split(",") if x.strip()}))
    except ValueError:
        raise ConfigError("--concurrency", f"{text!r} is not a comma-separated list of integers", "e.g. --concurrency 1,8") from None
    if not values or min(values) < 1:
        raise ConfigError("--concurrency", f"{text!r}: every load must be at least 1", "e.g. --concurrency 1,8")
    return values


@click.command("tune")
@config_argument
@click.option("--slo", "slo_text", default=None, help="Latency goals, e.g. ttft_p99_ms=500,tpot_p50_ms=50 (metric ttft, tpot, e2e or itl; "
              "statistic p50, p90, p95, p99, avg or max). Default: the first workload's slo_ms, met by every request.")  # fmt: skip
@click.option("--objective", type=click.Choice(["tokens", "requests"]), default="tokens", show_default=True,
              help="Goodput counted in output tokens/s or requests/s of the requests meeting every goal.")  # fmt: skip
@click.option("--space", "space_file", type=FILE, default=None,
              help="YAML file of `knob: [values]` lines replacing those knobs' values (one value fixes a knob).")  # fmt: skip
@click.option("--trials", type=click.IntRange(min=2), default=None, help="Trials at most (the config as it is counts as one). Default 8.")
@click.option("--minutes", type=click.FloatRange(min=0, min_open=True), default=None, help="Start no trial after this many minutes.")
@click.option("--concurrency", "concurrency_text", default=None, help="Loads to measure, e.g. 1,8. Default: the first workload's.")
@click.option("--requests", "base_requests", type=click.IntRange(min=1), default=8, show_default=True,
              help="Requests per load in the first, shortest trials (doubled at each later rung).")  # fmt: skip
@click.option(
    "--emit", "emit_dir", type=DIRECTORY, default=None, help="Write the trials as configs and one script for a GPU host; run nothing."
)
@click.option(
    "--aiconfigurator",
    is_flag=True,
    help="With --emit: also ask NVIDIA AIConfigurator (plan --predict) to simulate each emitted trial (seconds each).",
)
@click.option("--import", "import_dir", type=DIRECTORY, default=None, help="Answer from the results the --emit script wrote into DIR.")
@workdir_option
@json_option
@dry_run_option
def tune(
    config_file: Path,
    slo_text: str | None,
    objective: str,
    space_file: Path | None,
    trials: int | None,
    minutes: float | None,
    concurrency_text: str | None,
    base_requests: int,
    emit_dir: Path | None,
    aiconfigurator: bool,
    import_dir: Path | None,
    workdir: Path | None,
    as_json: bool,
    dry_run: bool,
) -> None:
    """Find the serving configuration of CONFIG with the most goodput under latency goals.

    \b
    The space (engine batch and token limits, KV cache, instances or workers, ... of this engine and server kind) is
    checked point by point (config rules, memory, engine limits), ranked by plan's serving model, then measured:
    successive halving benches the best-ranked points briefly and the better ones longer. Trials are kept under
    <workdir>/tune/trials/<config hash>/ (a rerun skips them); the answer is <workdir>/tune/best.yaml (a config `run`
    accepts), report.json and pareto.png.
    """
    from trtllm_forge.tune.slo import parse_slo, slo_from_workload
    from trtllm_forge.tune.space import default_space, read_space
    from trtllm_forge.tune.tuner import Question, prepare, run_search, show_plan, with_workload, workload_concurrencies

    if emit_dir and import_dir:
        raise ConfigError("--emit", "given with --import", "emit the trials first, run them on the GPU host, then --import their results")
    if aiconfigurator and emit_dir is None:
        raise ConfigError("--aiconfigurator", "needs --emit", "it simulates the trials --emit writes for a GPU host")
    config, wd = load(config_file, workdir)
    if import_dir is not None:
        from trtllm_forge.tune.emit import import_results

        document = import_results(config, import_dir, wd)
        if as_json:
            emit_json(document)
        return
    given = _concurrencies(concurrency_text)
    config = with_workload(config, given)
    concurrencies = given or workload_concurrencies(config)
    slo = parse_slo(slo_text) if slo_text is not None else slo_from_workload(dict(getattr(config.bench.workloads[0], "slo_ms", {}) or {}))
    if slo is None:
        raise ConfigError("--slo", "missing, and the first workload has no slo_ms", "e.g. --slo ttft_p99_ms=500,tpot_p50_ms=50")
    knobs = read_space(space_file, config) if space_file else default_space(config)
    question = Question(
        config, wd, slo, "requests" if objective == "requests" else "tokens", knobs, concurrencies, trials, minutes, base_requests
    )
    if not dry_run and emit_dir is None and config.engine.on_cpu:
        from trtllm_forge.pipeline import measure_host_once

        measure_host_once(config)  # the model needs this machine's bandwidth; measured before any server runs
    prepared = prepare(question)
    if dry_run:
        document = show_plan(prepared)
    elif emit_dir is not None:
        from trtllm_forge.tune.emit import emit

        document = emit(prepared, emit_dir.resolve(), aiconfigurator)
        info(f"wrote {len(document['trials'])} trials and {document['script']}; run it on the GPU host, then "
             f"`trtllm-forge tune {config_file} --import {emit_dir}`")  # fmt: skip
    else:
        document = run_search(prepared)
    if as_json:
        emit_json(document)
