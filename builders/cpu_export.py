"""What the CPU engine builders (OpenVINO, ONNX Runtime GenAI) share: the checkpoint check, the tokenizer files
the engine directory needs, the export's offline environment, tool versions, the reuse of an earlier identical
export and the dry-run listing."""

from __future__ import annotations

import os
import shlex
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import click

from trtllm_forge.errors import ConfigError, StepError
from trtllm_forge.package_versions import installed_version
from trtllm_forge.stages import hash_inputs, read_manifest
from trtllm_forge.ui import emit_json, info

STAGE = "build"
ENGINE_SUBDIR = "engine"
EXPORT_KEY = "export_key"  # the build manifest's outputs: see export_key()
EXPORT_TIMEOUT_S = 3600
# Offline: the checkpoint is local and a build must never reach a hub.
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
# HF tokenizer files copied from the checkpoint when the export did not write them (pre/post-processing
# load the tokenizer from the engine directory).
HF_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
    "chat_template.jinja",
    "generation_config.json",
)


def package_version(package: str) -> str:
    return installed_version(package) or "not installed"


def package_versions(packages: tuple[str, ...]) -> dict[str, str]:
    return {name: package_version(name) for name in packages}


def check_checkpoint(checkpoint_dir: Path) -> None:
    if not (checkpoint_dir / "config.json").is_file():
        raise ConfigError(
            "build.checkpoint",
            f"{checkpoint_dir} holds no Hugging Face checkpoint (config.json missing)",
            "run `trtllm-forge import CONFIG` first, or pass --checkpoint DIR",
        )


def check_export(engine_dir: Path, expected: tuple[str, ...]) -> None:
    missing = [n for n in expected if not (engine_dir / n).is_file()]
    if missing:
        raise StepError(f"{STAGE}.export", f"the export did not write {', '.join(missing)}", "see the export log in <workdir>/logs")


def copy_tokenizer_files(checkpoint_dir: Path, engine_dir: Path) -> None:
    for name in HF_TOKENIZER_FILES:
        src = checkpoint_dir / name
        if src.is_file() and not (engine_dir / name).exists():
            shutil.copy2(src, engine_dir / name)


def stage_hash_values(config: Any, export: dict[str, Any], tools: dict[str, str], **extra: Any) -> dict[str, Any]:
    """What the build stage's input hash covers on CPU: the export's settings (its argv left out: it holds paths),
    the engine and quantization sections, trust_remote_code and the tool versions, plus the builder's `extra`."""
    return {
        **extra,
        "export": export_settings(export),
        "engine": config.engine.model_dump(mode="json"),
        "quantization": config.quantization.model_dump(mode="json"),
        "trust_remote_code": config.model.trust_remote_code,
        "tools": tools,
    }


def export_settings(export: Mapping[str, Any]) -> dict[str, Any]:
    """An export plan's settings without its argv (which holds paths): what a hash of the export may depend on."""
    return {key: value for key, value in export.items() if key != "argv"}


def export_key(settings: Mapping[str, Any], tools: Mapping[str, str], inputs_sha256: Mapping[str, str]) -> str:
    """What an export's files depend on: its settings, the tool versions and the content digests of its inputs
    (checkpoint, calibration file). Recorded in the build manifest's outputs."""
    return hash_inputs({"export": export_settings(settings), "tools": dict(tools), "inputs": dict(inputs_sha256)}, {})


def reuse_previous_export(stage_dir: Path, key: str, engine_dir: Path, exclude: tuple[str, ...]) -> Path | None:
    """Fill `engine_dir` with the files of the stage's previous engine directory (`stage_dir`/engine) when that
    export had the same `export_key`: a build whose other settings changed (engine limits, target, draft) then
    rewrites its engine config without exporting again. Files are hard links where the filesystem allows (the
    builders replace files, never write into them); `exclude` are the files the builder writes after the
    export. Returns the previous engine directory, or None when there is nothing to reuse."""
    previous = read_manifest(stage_dir) or {}
    source = stage_dir / ENGINE_SUBDIR
    if previous.get("outputs", {}).get(EXPORT_KEY) != key or not source.is_dir():
        return None
    engine_dir.mkdir(parents=True)
    for item in source.iterdir():
        if item.is_file() and item.name not in exclude:
            try:
                os.link(item, engine_dir / item.name)
            except OSError:
                shutil.copy2(item, engine_dir / item.name)
    return source


def size_bytes(directory: Path) -> int:
    """The files directly in `directory`, summed."""
    return sum(p.stat().st_size for p in directory.iterdir() if p.is_file())


class CpuExportBuilder:
    """The `Builder` methods the CPU builders share: their plans describe themselves (`to_json`, with the argv lists
    under "commands") and list the files they write (`files`). Subclasses give plan, commands and execute."""

    def describe(self, plan: Any) -> dict[str, Any]:
        return plan.to_json()

    def show_dry_run(self, config: Any, workdir: Path, plan: Any, as_json: bool) -> None:
        show_dry_run(plan.to_json(), plan.files, as_json)


def show_dry_run(document: dict[str, Any], files: list[Path], as_json: bool) -> None:
    """`build-engine --dry-run`: the plan's document as JSON, or its commands and the files it would write."""
    if as_json:
        emit_json({"dry_run": True, **document})
        return
    info("[bold]build-engine (dry run)[/bold]: would run")
    for argv in document["commands"]:
        click.echo(shlex.join(argv), err=True)
    info("and write:")
    for path in files:
        click.echo(f"  {path}", err=True)
