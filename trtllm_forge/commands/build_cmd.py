"""`trtllm-forge build-engine CONFIG`: the build stage, dispatched on engine.backend."""

from __future__ import annotations

import importlib
import shlex
from pathlib import Path

import click

from trtllm_forge.commands.options import config_argument, dry_run_option, force_option, json_option, load, workdir_option
from trtllm_forge.errors import ConfigError
from trtllm_forge.ui import emit_json, info


def _build_openvino(config, workdir: Path, checkpoint: Path, force: bool, dry_run: bool, as_json: bool) -> None:
    if config.engine.backend == "onnxruntime":  # same entry points as the OpenVINO builder
        from trtllm_forge.builders.onnxruntime import build_engine, plan_build
    else:
        from trtllm_forge.builders.openvino import build_engine, plan_build  # type: ignore[assignment]

    if dry_run:
        plan = plan_build(config, workdir, checkpoint)
        if as_json:
            emit_json({"dry_run": True, **plan.to_json()})
            return
        info("[bold]build-engine (dry run)[/bold]: would run")
        for argv in plan.to_json()["commands"]:
            click.echo(shlex.join(argv), err=True)
        info("and write:")
        for path in plan.files:
            click.echo(f"  {path}", err=True)
        return
    result = build_engine(config, workdir, checkpoint, force=force)
    if as_json:
        emit_json({**result.manifest, "skipped": result.skipped})
    else:
        info(f"engine: {result.manifest['outputs']['engine_dir']}")


def _build_tensorrt_llm(config, workdir: Path, checkpoint: Path, force: bool, dry_run: bool, as_json: bool) -> None:
    try:
        module = importlib.import_module("trtllm_forge.builders.tensorrt_llm")
    except ImportError:
        module = None
    build = getattr(module, "build", None)
    if build is None:
        raise ConfigError(
            "engine.backend",
            "TensorRT-LLM builder not available in this installation",
            "use engine.backend: openvino on CPU",
        )
    build(config=config, workdir=workdir, checkpoint_dir=checkpoint, force=force, dry_run=dry_run, as_json=as_json)


@click.command("build-engine")
@config_argument
@workdir_option
@click.option(
    "--checkpoint",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Hugging Face checkpoint directory to build from. Default: the import stage's output.",
)
@force_option
@dry_run_option
@json_option
def build_engine(config_file: Path, workdir: Path | None, checkpoint: Path | None, force: bool, dry_run: bool, as_json: bool) -> None:
    """Build the engine for CONFIG into <workdir>/build/engine (OpenVINO IR or an ONNX Runtime GenAI model on CPU, TensorRT-LLM on GPU).

    Skipped when the checkpoint and the settings that shape the engine are unchanged.
    """
    config, workdir = load(config_file, workdir)
    if checkpoint is None:
        from trtllm_forge.importer.stage import imported_checkpoint

        checkpoint = imported_checkpoint(workdir) or workdir / "import" / "checkpoint"
    checkpoint = checkpoint.resolve()
    if config.engine.on_cpu:
        _build_openvino(config, workdir, checkpoint, force, dry_run, as_json)
    else:
        _build_tensorrt_llm(config, workdir, checkpoint, force, dry_run, as_json)
