"""The build stage's typed result: what every builder hands to render and to the pipeline (the start of typed
stage results, issue #13). The manifest's `outputs` are read here, in one place, instead of by string keys at
each call site (which is how `run` on an llmapi config once crashed reading `engine_dir`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from trtllm_forge.stages import StageResult


@dataclass
class BuildResult(StageResult):
    """A finished (or skipped) build stage.

    target  engine: engine_dir holds engines (TensorRT-LLM) or OpenVINO IR; llmapi: llmapi_dir holds model.yaml
            (LLM() arguments) and, on CPU, engine_dir the OpenVINO IR the LLM-API stand-in loads.
    """

    target: Literal["engine", "llmapi"] = "engine"
    engine_dir: Path | None = None
    llmapi_dir: Path | None = None

    @property
    def model_yaml(self) -> Path | None:
        return self.llmapi_dir / "model.yaml" if self.llmapi_dir else None

    @classmethod
    def from_stage(cls, result: StageResult) -> "BuildResult":
        if isinstance(result, BuildResult):
            return result
        outputs = result.manifest.get("outputs", {})
        target = "llmapi" if outputs.get("target") == "llmapi" or outputs.get("llmapi_dir") else "engine"
        engine_dir = outputs.get("engine_dir")
        llmapi_dir = outputs.get("llmapi_dir")
        return cls(
            result.name,
            result.directory,
            result.skipped,
            result.manifest,
            target,
            Path(engine_dir) if engine_dir else None,
            Path(llmapi_dir) if llmapi_dir else None,
        )
