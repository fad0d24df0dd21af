"""`trtllm-forge build-engine CONFIG`: the build stage, run by the registry's builder of engine.backend/target."""

from __future__ import annotations

from pathlib import Path

import click

from trtllm_forge.commands.options import config_argument, directory_option, dry_run_option, force_option, json_option, load, workdir_option


@click.command("build-engine")
@config_argument
@workdir_option
@directory_option("--checkpoint", help="Hugging Face checkpoint directory to build from. Default: the import stage's output.")
@force_option
@dry_run_option
@json_option
def build_engine(config_file: Path, workdir: Path | None, checkpoint: Path | None, force: bool, dry_run: bool, as_json: bool) -> None:
    """Build the engine of engine.backend for CONFIG into <workdir>/build/engine (`trtllm-forge config schema` lists the backends).

    Skipped when the checkpoint and the settings that shape the engine are unchanged.
    """
    config, workdir = load(config_file, workdir)
    if checkpoint is None:
        from trtllm_forge.importer.stage import imported_checkpoint

        checkpoint = imported_checkpoint(workdir) or workdir / "import" / "checkpoint"
    checkpoint = checkpoint.resolve()
    from trtllm_forge.builders.registry import builder_for, report_build

    builder = builder_for(config)
    plan = builder.plan(config, workdir, checkpoint)
    if dry_run:
        builder.show_dry_run(config, workdir, plan, as_json)
        return
    report_build(builder.execute(config, workdir, plan, force=force), as_json)
