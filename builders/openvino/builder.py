"""The `build` stage on CPU: export the imported checkpoint to OpenVINO IR with optimum-intel, then write the
TensorRT-LLM-shaped engine config.json beside it. Output: <workdir>/build/engine/."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from trtllm_forge.builders.cpu_export import (
    ENGINE_SUBDIR,
    EXPORT_KEY,
    EXPORT_TIMEOUT_S,
    OFFLINE_ENV,
    STAGE,
    CpuExportBuilder,
    check_checkpoint,
    check_export,
    copy_tokenizer_files,
    export_key,
    package_version,
    package_versions,
    reuse_previous_export,
    size_bytes,
    stage_hash_values,
)
from trtllm_forge.builders.openvino import engine_json
from trtllm_forge.builders.openvino.engine import ENGINE
from trtllm_forge.builders.openvino.engine_json import HF_CONFIG_COPY
from trtllm_forge.builders.openvino.plan import (
    IR_FILES,
    TOKENIZER_IR_FILES,
    DraftPlan,
    ExportPlan,
    plan_draft_export,
    plan_export,
)

from trtllm_forge.config import ForgeConfig
from trtllm_forge.engine_config import ENGINE_CONFIG
from trtllm_forge.errors import StepError
from trtllm_forge.stage_results import BuildResult
from trtllm_forge.stages import StageRecorder, run_stage, sha256_file

LLMAPI_SUBDIR = "llmapi"
# Packages whose versions change what the export produces (part of the stage's input hash).
TOOL_PACKAGES = ("openvino", "openvino-genai", "openvino-tokenizers", "optimum", "optimum-intel", "nncf", "transformers", "torch")


def tool_versions() -> dict[str, str]:
    return package_versions(TOOL_PACKAGES)


def genai_version() -> str:
    return package_version("openvino-genai")


@dataclass(frozen=True)
class BuildPlan:
    """What `build-engine` would do: printed by --dry-run, executed by build_engine."""

    checkpoint_dir: Path
    engine_dir: Path
    export: ExportPlan
    model_yaml: Path | None = None  # engine.target llmapi: the LLM() arguments of the CPU LLM-API stand-in
    draft: DraftPlan | None = None

    @property
    def files(self) -> list[Path]:
        names = [*IR_FILES, *TOKENIZER_IR_FILES, ENGINE_CONFIG, HF_CONFIG_COPY, "tokenizer.json", "tokenizer_config.json"]
        return [self.engine_dir / n for n in names] + [self.engine_dir.parent / "manifest.json"]

    def to_json(self) -> dict:
        return {
            "stage": STAGE,
            "backend": ENGINE.backend,
            "checkpoint_dir": str(self.checkpoint_dir),
            "engine_dir": str(self.engine_dir),
            "commands": [self.export.argv] + ([self.draft.argv] if self.draft and self.draft.argv else []),
            "files": [str(f) for f in self.files],
            "export": self.export.to_json(),
        }


def plan_build(config: ForgeConfig, workdir: Path, checkpoint_dir: Path) -> BuildPlan:
    engine_dir = workdir / STAGE / ENGINE_SUBDIR
    model_yaml = workdir / STAGE / LLMAPI_SUBDIR / "model.yaml" if config.engine.target == "llmapi" else None
    draft = plan_draft_export(config, engine_dir)
    return BuildPlan(checkpoint_dir, engine_dir, plan_export(config, checkpoint_dir, engine_dir), model_yaml, draft)


def _hash_values(config: ForgeConfig, plan: ExportPlan, inputs_sha256: dict[str, str]) -> dict:
    # adapter: an engine directory from before config.json named its served adapter is rewritten, not reused.
    return stage_hash_values(
        config, plan.to_json(), tool_versions(), model_dtype=config.model.dtype, inputs_sha256=inputs_sha256, adapter=ENGINE.served_adapter
    )


def _export_draft(draft: DraftPlan, recorder: StageRecorder) -> None:
    """The draft model of draft-target speculative decoding, into <engine>/draft (see plan.DraftPlan)."""
    if draft.argv is None:
        shutil.copytree(draft.source, draft.output_dir)
    else:
        recorder.run(draft.argv, "export-draft", env=OFFLINE_ENV, timeout=EXPORT_TIMEOUT_S)
    if not (draft.output_dir / IR_FILES[0]).is_file():
        raise StepError(f"{STAGE}.export-draft", f"no draft model in {draft.output_dir}", "see the export-draft log in <workdir>/logs")


def build_engine(config: ForgeConfig, workdir: Path, checkpoint_dir: Path, force: bool = False) -> BuildResult:
    """Export `checkpoint_dir` to <workdir>/build/engine (skipped when nothing that matters changed). With
    engine.target llmapi also <workdir>/build/llmapi/model.yaml, the LLM() arguments of the CPU LLM-API stand-in."""
    return _execute(config, Path(workdir), plan_build(config, Path(workdir), Path(checkpoint_dir)), force)


class OpenVINOBuilder(CpuExportBuilder):
    """The CPU builder (engine.backend openvino, both targets); implements builders.protocol.Builder."""

    def plan(self, config: ForgeConfig, workdir: Path, checkpoint_dir: Path) -> BuildPlan:
        return plan_build(config, Path(workdir), Path(checkpoint_dir))

    def commands(self, plan: BuildPlan) -> list[list[str]]:
        written = [["trtllm-forge:write-yaml", str(plan.model_yaml)]] if plan.model_yaml else []
        return [list(plan.export.argv), *written]

    def execute(self, config: ForgeConfig, workdir: Path, plan: BuildPlan, force: bool = False) -> BuildResult:
        return _execute(config, Path(workdir), plan, force)


def _execute(config: ForgeConfig, workdir: Path, recorded: BuildPlan, force: bool) -> BuildResult:
    checkpoint_dir = recorded.checkpoint_dir
    check_checkpoint(checkpoint_dir)
    # The export's inputs are digested once: for the stage's input hash and for the export's own key.
    export_inputs = {"checkpoint": sha256_file(checkpoint_dir)}
    if recorded.export.calibration_file:
        export_inputs["calibration"] = sha256_file(recorded.export.calibration_file)
    input_paths = {"draft": recorded.draft.source} if recorded.draft is not None else {}

    def body(tmp: Path, recorder: StageRecorder) -> dict:
        engine_dir = tmp / ENGINE_SUBDIR
        run_plan = plan_export(config, checkpoint_dir, engine_dir)
        versions = tool_versions()
        recorder.tool_versions.update(versions)
        settings = {**run_plan.to_json(), "trust_remote_code": config.model.trust_remote_code}
        key = export_key(settings, versions, export_inputs)
        previous = None if force else reuse_previous_export(workdir / STAGE, key, engine_dir, exclude=(ENGINE_CONFIG, HF_CONFIG_COPY))
        if previous is None:
            recorder.run(run_plan.argv, "export", env=OFFLINE_ENV, timeout=EXPORT_TIMEOUT_S)
        else:
            # engine_json.write reads the export's own config.json, which the previous build kept as hf_config.json.
            shutil.copy2(previous / HF_CONFIG_COPY, engine_dir / "config.json")
            recorder.notes.append("export reused from the previous build: same checkpoint, export settings and tool versions")
        check_export(engine_dir, (*IR_FILES, *TOKENIZER_IR_FILES, "config.json"))
        copy_tokenizer_files(checkpoint_dir, engine_dir)
        run_draft = plan_draft_export(config, engine_dir)
        if run_draft is not None:
            _export_draft(run_draft, recorder)
        engine_json.write(engine_dir, config, recorded.export, genai_version(), versions, recorded.draft)
        if recorded.export.awq and not recorded.export.calibration_file:
            recorder.notes.append("int4_awq without quantization.calibration.dataset: data-free AWQ was applied")
        llmapi_outputs = {}
        if recorded.model_yaml:
            from trtllm_forge.builders.tensorrt_llm.llmapi import write_model_yaml

            write_model_yaml(config, tmp / LLMAPI_SUBDIR, str(recorded.engine_dir))
            llmapi_outputs = {"target": "llmapi", "llmapi_dir": str(recorded.model_yaml.parent), "model_yaml": str(recorded.model_yaml)}
        return {
            **llmapi_outputs,
            "engine_dir": str(recorded.engine_dir),
            EXPORT_KEY: key,
            "export_reused": previous is not None,
            "weight_format": run_plan.weight_format,
            "inference_precision": run_plan.inference_precision,
            "kv_cache_precision": run_plan.kv_cache_precision,
            "size_bytes": size_bytes(engine_dir),
        }

    values = _hash_values(config, recorded.export, export_inputs)
    return BuildResult.from_stage(run_stage(workdir, STAGE, values, input_paths, body, force=force))
