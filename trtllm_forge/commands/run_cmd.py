"""`trtllm-forge run CONFIG`: the whole chain, import → build → render → deploy → smoke → verify → bench → report."""

from __future__ import annotations

from pathlib import Path

import click

from trtllm_forge.commands.options import config_argument, force_option, json_option, load, workdir_option
from trtllm_forge.errors import error_document
from trtllm_forge.ui import emit_json


@click.command("run")
@config_argument
@workdir_option
@force_option
@json_option
@click.option("--keep-serving", is_flag=True, help="Leave the Triton server running at the end.")
@click.option("--skip-bench", is_flag=True, help="Stop after verify, even when the config has bench workloads.")
@click.option("--skip-verify", is_flag=True, help="Leave out the comparison with transformers (the smoke answer is still checked).")
@click.option("--dry-run", is_flag=True, help="Print each stage's commands and files; change nothing.")
def run(
    config_file: Path,
    workdir: Path | None,
    force: bool,
    as_json: bool,
    keep_serving: bool,
    skip_bench: bool,
    skip_verify: bool,
    dry_run: bool,
) -> None:
    """Run every stage for CONFIG; stages whose inputs are unchanged are skipped.

    The server is stopped at the end (also on errors and Ctrl-C) unless --keep-serving is given.
    With --json, stdout holds one JSON document also when a stage fails: the report so far, "passed": false
    and an "error" object (kind, exit_code, message and each error's source, field, problem and fix).
    """
    from trtllm_forge.pipeline import RunReport, run_pipeline, show_dry_run

    report: RunReport | None = None
    try:
        config, workdir = load(config_file, workdir)
        if dry_run:
            show_dry_run(config, config_file, workdir, as_json)
            return
        report = RunReport(config.name or "config", workdir)
        run_pipeline(
            config, workdir, force=force, keep_serving=keep_serving, run_verify=not skip_verify, run_bench=not skip_bench, report=report
        )
    except BaseException as exc:
        if as_json and not isinstance(exc, (SystemExit, click.exceptions.Exit)):
            document = report.to_json() if report is not None else {"config": str(config_file), "stages": []}
            emit_json({**document, "passed": False, "error": error_document(exc)})
        raise
    if as_json:
        emit_json(report.to_json())
    if not report.passed:
        raise SystemExit(1)
