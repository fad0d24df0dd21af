"""The typed results the stages hand each other: import → `ImportResult`, build → `BuildResult`, render →
`RenderResult`, deploy → `Deployment` (deploy/kinds/protocol.py; each server kind serializes its own, e.g.
Triton's <workdir>/deploy/state.json, read back only by the kind's `read`).

Each result is the stage's `StageResult` (name, directory, skipped, manifest) plus typed fields. A stage's
`manifest.json` `outputs` are their serialization and are read here, in one place: `from_stage` when a stage
has just run (or was skipped), `from_manifest(stage_dir)` / `in_workdir(workdir)` when a later command finds
an earlier run's output on disk. No other module indexes a manifest's outputs by string (which is how `run`
on an llmapi config once crashed reading `engine_dir`).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, TypeVar

from trtllm_forge.errors import ConfigError
from trtllm_forge.stages import StageResult, read_manifest

ResultT = TypeVar("ResultT", bound="TypedStageResult")


def _path(value: Any) -> Path | None:
    return Path(value) if value else None


def moved_paths(value: Any, recorded_workdir: str | None, workdir: Path) -> Any:
    """`value` (a recorded output: a string, or lists and mappings of them) with every path under the workdir the
    stage ran in (`recorded_workdir`, from its manifest) pointing into `workdir` instead. A workdir copied or moved
    after its stages ran then serves its own files, not the original's (which may be gone or rebuilt)."""
    here = Path(workdir).absolute()
    if not recorded_workdir or Path(recorded_workdir) == here:
        return value
    old, new = recorded_workdir.rstrip("/"), str(here)

    def move(item: Any) -> Any:
        if isinstance(item, str):
            return new if item == old else item.replace(old + "/", new + "/")
        if isinstance(item, list):
            return [move(v) for v in item]
        if isinstance(item, dict):
            return {k: move(v) for k, v in item.items()}
        return item

    return move(value)


@dataclass(kw_only=True)
class TypedStageResult(StageResult):
    """Base of the typed results: how a manifest's `outputs` become fields (`_fields`, per stage)."""

    STAGE: ClassVar[str]

    @classmethod
    def _fields(cls, outputs: dict[str, Any], directory: Path) -> dict[str, Any]:
        raise NotImplementedError

    @classmethod
    def from_stage(cls: type[ResultT], result: StageResult) -> ResultT:
        """The typed view of a stage run (done or skipped) by `stages.run_stage`."""
        if isinstance(result, cls):
            return result
        outputs = moved_paths(dict(result.manifest.get("outputs") or {}), result.manifest.get("workdir"), result.directory.parent)
        return cls(
            name=result.name,
            directory=result.directory,
            skipped=result.skipped,
            manifest=result.manifest,
            **cls._fields(outputs, result.directory),
        )

    @classmethod
    def from_manifest(cls: type[ResultT], stage_dir: Path) -> ResultT | None:
        """The result an earlier run recorded in `stage_dir`/manifest.json, or None when there is none."""
        manifest = read_manifest(Path(stage_dir))
        if manifest is None:
            return None
        return cls.from_stage(StageResult(cls.STAGE, Path(stage_dir), True, manifest))

    @classmethod
    def in_workdir(cls: type[ResultT], workdir: Path) -> ResultT | None:
        return cls.from_manifest(Path(workdir) / cls.STAGE)

    def moved_here(self, recorded: str) -> str:
        """A path this stage wrote into one of its own files (not its manifest), for this workdir (`moved_paths`)."""
        return moved_paths(recorded, self.manifest.get("workdir"), Path(self.directory).parent)


@dataclass(kw_only=True)
class ImportResult(TypedStageResult):
    """The imported checkpoint: the converted directory for GGUF sources, the source directory itself for
    Hugging Face ones (weights are not copied)."""

    STAGE: ClassVar[str] = "import"
    checkpoint_dir: Path
    tokenizer_dir: Path | None = None
    dtype: str | None = None  # model.dtype resolved by trtllm_forge.dtypes
    source_kind: str | None = None
    source_path: Path | None = None
    model_type: str | None = None
    architecture: str | None = None
    num_parameters: int | None = None
    tokenizer: dict[str, Any] = field(default_factory=dict)  # tokenizer facts (bos/eos ids, add_bos_token, ...)

    @classmethod
    def _fields(cls, outputs: dict[str, Any], directory: Path) -> dict[str, Any]:
        if not outputs.get("checkpoint_dir"):
            raise ConfigError(
                str(directory / "manifest.json"), "the import manifest has no checkpoint_dir", "rerun `trtllm-forge import CONFIG --force`"
            )
        return {
            "checkpoint_dir": Path(outputs["checkpoint_dir"]),
            "tokenizer_dir": _path(outputs.get("tokenizer_dir")),
            "dtype": outputs.get("dtype"),
            "source_kind": outputs.get("source_kind"),
            "source_path": _path(outputs.get("source_path")),
            "model_type": outputs.get("model_type"),
            "architecture": outputs.get("architecture"),
            "num_parameters": outputs.get("num_parameters"),
            "tokenizer": dict(outputs.get("tokenizer") or {}),
        }


@dataclass(kw_only=True)
class BuildResult(TypedStageResult):
    """A finished (or skipped) build stage.

    target  engine: engine_dir holds engines (TensorRT-LLM) or the CPU engine's files (OpenVINO IR); llmapi:
            llmapi_dir holds model.yaml (LLM() arguments) and, on CPU, engine_dir the IR the LLM-API stand-in loads.
    """

    STAGE: ClassVar[str] = "build"
    target: Literal["engine", "llmapi"] = "engine"
    engine_dir: Path | None = None
    llmapi_dir: Path | None = None
    draft_engine_dir: Path | None = None  # draft-target decoding's second engine (engine path)
    quantized_checkpoint: Path | None = None  # ModelOpt's Hugging Face export the llmapi model.yaml loads (GPU llmapi)

    @property
    def model_yaml(self) -> Path | None:
        return self.llmapi_dir / "model.yaml" if self.llmapi_dir else None

    @classmethod
    def _fields(cls, outputs: dict[str, Any], directory: Path) -> dict[str, Any]:
        llmapi = outputs.get("target") == "llmapi" or bool(outputs.get("llmapi_dir"))
        return {
            "target": "llmapi" if llmapi else "engine",
            "engine_dir": _path(outputs.get("engine_dir")),
            "llmapi_dir": _path(outputs.get("llmapi_dir")),
            "draft_engine_dir": _path(outputs.get("draft_engine_dir")),
            "quantized_checkpoint": _path(outputs.get("quantized_checkpoint")),
        }


@dataclass(kw_only=True)
class RenderResult(TypedStageResult):
    """The rendered Triton model repository and how to launch a server on it (<workdir>/render)."""

    STAGE: ClassVar[str] = "render"
    repository: Path
    kind: str | None = None  # a repository kind of render/values.py (inflight_batcher_llm, cpu_engine, llmapi, ...)
    models: list[str] = field(default_factory=list)
    launch_command: list[str] = field(default_factory=list)  # the tritonserver (or MPI leader) argv
    launch_env: dict[str, str] = field(default_factory=dict)
    launch_script: Path | None = None
    world_size: int = 1
    engine_dir: Path | None = None  # the engine the repository serves (None for kinds without one)
    warnings: list[str] = field(default_factory=list)

    @classmethod
    def _fields(cls, outputs: dict[str, Any], directory: Path) -> dict[str, Any]:
        command = outputs.get("launch_command") or []
        return {
            "repository": Path(outputs.get("repository") or directory / "model_repository"),
            "kind": outputs.get("kind"),
            "models": list(outputs.get("models") or []),
            "launch_command": shlex.split(command) if isinstance(command, str) else [str(a) for a in command],
            "launch_env": dict(outputs.get("launch_env") or {}),
            "launch_script": _path(outputs.get("launch_script")),
            "world_size": int(outputs.get("world_size") or 1),
            "engine_dir": _path(outputs.get("engine_dir")),
            "warnings": list(outputs.get("warnings") or []),
        }
