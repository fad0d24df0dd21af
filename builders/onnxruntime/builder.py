"""The `build` stage with ONNX Runtime GenAI: export the imported checkpoint with onnxruntime_genai's model builder,
then write the TensorRT-LLM-shaped engine config.json beside it. Output: <workdir>/build/engine/."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from trtllm_forge.builders.cpu_export import (
    ENGINE_SUBDIR,
    EXPORT_TIMEOUT_S,
    OFFLINE_ENV,
    STAGE,
    CpuExportBuilder,
    check_checkpoint,
    check_export,
    copy_tokenizer_files,
    package_versions,
    size_bytes,
    stage_hash_values,
)
from trtllm_forge.builders.onnxruntime import engine_json
from trtllm_forge.builders.onnxruntime.engine import ENGINE
from trtllm_forge.builders.onnxruntime.plan import BACKEND, MODEL_FILES, OrtExportPlan, plan_export

from trtllm_forge.config import ForgeConfig
from trtllm_forge.engine_config import ENGINE_CONFIG
from trtllm_forge.errors import ConfigError
from trtllm_forge.stage_results import BuildResult
from trtllm_forge.stages import StageRecorder, run_stage

CACHE_SUBDIR = "builder-cache"  # the builder's scratch (-c); removed after the export
# Packages whose versions change what the export produces (part of the stage's input hash).
TOOL_PACKAGES = ("onnxruntime-genai", "onnxruntime", "onnx", "onnx-ir", "transformers", "torch")


def tool_versions() -> dict[str, str]:
    return package_versions(TOOL_PACKAGES)


@dataclass(frozen=True)
class BuildPlan:
    """What `build-engine` would do: printed by --dry-run, executed by build_engine."""

    checkpoint_dir: Path
    engine_dir: Path
    export: OrtExportPlan

    @property
    def commands(self) -> list[list[str]]:
        return [self.export.argv]

    @property
    def files(self) -> list[Path]:
        names = [*MODEL_FILES, ENGINE_CONFIG, engine_json.HF_CONFIG_COPY, "tokenizer.json", "tokenizer_config.json"]
        return [self.engine_dir / n for n in names] + [self.engine_dir.parent / "manifest.json"]

    def to_json(self) -> dict:
        return {
            "stage": STAGE,
            "backend": BACKEND,
            "checkpoint_dir": str(self.checkpoint_dir),
            "engine_dir": str(self.engine_dir),
            "commands": self.commands,
            "files": [str(f) for f in self.files],
            "export": self.export.to_json(),
        }


def _plan_in(config: ForgeConfig, stage_dir: Path, checkpoint_dir: Path | None) -> OrtExportPlan:
    return plan_export(config, checkpoint_dir, stage_dir / ENGINE_SUBDIR, stage_dir / CACHE_SUBDIR)


def plan_build(config: ForgeConfig, workdir: Path, checkpoint_dir: Path) -> BuildPlan:
    stage_dir = Path(workdir) / STAGE
    return BuildPlan(checkpoint_dir, stage_dir / ENGINE_SUBDIR, _plan_in(config, stage_dir, checkpoint_dir))


def _hash_values(config: ForgeConfig, plan: OrtExportPlan) -> dict:
    # adapter: an engine directory from before config.json named its served adapter is rewritten, not reused.
    return stage_hash_values(config, plan.to_json(), tool_versions(), backend=BACKEND, adapter=ENGINE.served_adapter)


class OnnxRuntimeBuilder(CpuExportBuilder):
    """The ONNX Runtime GenAI builder (engine.backend onnxruntime, engine.target engine); implements
    builders.protocol.Builder."""

    def plan(self, config: ForgeConfig, workdir: Path, checkpoint_dir: Path) -> BuildPlan:
        if config.engine.target != "engine":
            raise ConfigError("engine.target", f"the LLM API stand-in serves OpenVINO IR, not {BACKEND}", "use engine.target: engine")
        return plan_build(config, Path(workdir), Path(checkpoint_dir))

    def commands(self, plan: BuildPlan) -> list[list[str]]:
        return [list(argv) for argv in plan.commands]

    def execute(self, config: ForgeConfig, workdir: Path, plan: BuildPlan, force: bool = False) -> BuildResult:
        return _execute(config, Path(workdir), plan, force)


def build_engine(config: ForgeConfig, workdir: Path, checkpoint_dir: Path, force: bool = False) -> BuildResult:
    """Export `checkpoint_dir` to <workdir>/build/engine (skipped when nothing that matters changed)."""
    builder = OnnxRuntimeBuilder()
    return builder.execute(config, workdir, builder.plan(config, workdir, checkpoint_dir), force=force)


def _execute(config: ForgeConfig, workdir: Path, recorded: BuildPlan, force: bool) -> BuildResult:
    checkpoint_dir = recorded.checkpoint_dir
    check_checkpoint(checkpoint_dir)

    def body(tmp: Path, recorder: StageRecorder) -> dict:
        engine_dir = tmp / ENGINE_SUBDIR
        run_plan = _plan_in(config, tmp, checkpoint_dir)
        versions = tool_versions()
        recorder.tool_versions.update(versions)
        # Offline: the checkpoint is local and a build must never reach a hub. The builder is run from the stage's
        # directory: it imports its own top-level `builders` package, which our repository's `builders/` would
        # shadow when the current directory is the repository.
        recorder.run(run_plan.argv, "export", env=OFFLINE_ENV, cwd=tmp, timeout=EXPORT_TIMEOUT_S)
        shutil.rmtree(tmp / CACHE_SUBDIR, ignore_errors=True)
        check_export(engine_dir, MODEL_FILES)
        copy_tokenizer_files(checkpoint_dir, engine_dir)
        engine_json.write(engine_dir, checkpoint_dir, config, recorded.export, versions["onnxruntime-genai"], versions)
        return {
            "target": "engine",
            "engine_dir": str(recorded.engine_dir),
            "backend": BACKEND,
            "precision": run_plan.precision,
            "block_size": run_plan.block_size,
            "size_bytes": size_bytes(engine_dir),
        }

    return BuildResult.from_stage(
        run_stage(workdir, STAGE, _hash_values(config, recorded.export), {"checkpoint": checkpoint_dir}, body, force=force)
    )
