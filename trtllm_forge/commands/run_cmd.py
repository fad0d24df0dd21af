"""`trtllm-forge run CONFIG`: the whole chain, import → build → render → deploy → smoke → verify → bench → report."""

from __future__ import annotations

from pathlib import Path

import click

from trtllm_forge.commands.options import config_argument, force_option, json_option, load, workdir_option
from trtllm_forge.config.schema import ForgeConfig
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
            refuse_missing_inputs(config)
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


def refuse_missing_inputs(config: ForgeConfig) -> None:
    """The dry run plans with the checkpoints the run would read: one that is not there is refused (exit 2)
    before anything is planned, naming its field, as the run itself would refuse it at import."""
    from trtllm_forge.config.schema import BUILTIN_MODELS
    from trtllm_forge.errors import ConfigError, ConfigErrors

    fields = {
        "model.source": None if config.model.source in BUILTIN_MODELS else config.model.source,
        "model.tokenizer": config.model.tokenizer,
        "engine.speculative.draft_model": config.engine.speculative.draft_model,
    }
    problems = [
        ConfigError(name, f"{config.resolve_path(value)} does not exist on this machine", "give the path of the checkpoint here")
        for name, value in fields.items()
        if value and not config.resolve_path(value).exists()
    ]
    if config.config_file is not None:
        problems = [problem.located(str(config.config_file)) for problem in problems]
    if problems:
        raise ConfigErrors(problems) if len(problems) > 1 else problems[0]
