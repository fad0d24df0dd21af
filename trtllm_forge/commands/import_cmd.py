"""`trtllm-forge import CONFIG`: check or convert model.source into a Hugging Face checkpoint directory."""

from __future__ import annotations

import shlex
from pathlib import Path

import click

from trtllm_forge.commands.options import config_argument, dry_run_option, force_option, json_option, load, workdir_option
from trtllm_forge.ui import emit_json, info


@click.command("import")
@config_argument
@workdir_option
@force_option
@dry_run_option
@json_option
def import_model(config_file: Path, workdir: Path | None, force: bool, dry_run: bool, as_json: bool) -> None:
    """Import the checkpoint named by model.source into WORKDIR/import/.

    \b
    A .gguf file (or the built-in smollm2-135m) is converted to a Hugging Face directory
    (safetensors + tokenizer + generation config) in a child process; a local Hugging Face
    directory is checked and recorded without copying its weights.
    """
    from trtllm_forge.importer.stage import import_checkpoint, plan_import

    config, workdir = load(config_file, workdir)
    if dry_run:
        plan = plan_import(config, workdir).to_json(force=force)
        if as_json:
            emit_json(plan)
            return
        click.echo(f"import (dry run): {plan['source_kind']} source {plan['source_path']}", err=True)
        if plan["would_skip"]:
            click.echo(f"  inputs unchanged: would skip; checkpoint stays at {plan['checkpoint_dir']}", err=True)
        for argv in plan["commands"]:
            click.echo(f"  would run: {shlex.join(argv)}", err=True)
        for path in plan["files"]:
            click.echo(f"  would write: {path}", err=True)
        for note in plan["notes"]:
            click.echo(f"  note: {note}", err=True)
        return
    result = import_checkpoint(config, workdir, force=force)
    if as_json:
        emit_json(
            {
                "stage": result.name,
                "skipped": result.skipped,
                "directory": str(result.directory),
                "input_hash": result.manifest.get("input_hash"),
                "outputs": result.manifest.get("outputs", {}),
            }
        )
        return
    tok = result.tokenizer
    info(f"  checkpoint: {result.checkpoint_dir}")
    info(
        f"  {result.architecture} ({result.model_type}), {(result.num_parameters or 0) / 1e6:.1f}M "
        f"parameters, {result.dtype}; tokenizer bos={tok.get('bos_token_id')} eos={tok.get('eos_token_id')} "
        f"add_bos={tok.get('add_bos_token')}"
    )
