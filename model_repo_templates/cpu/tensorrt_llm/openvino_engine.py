"""OpenVINO GenAI behind the CPU engine adapter protocol (engine_adapter.py): its own ContinuousBatchingPipeline,
GenerationConfig, SchedulerConfig and GenerationStatus, with the prompt handed over as an OpenVINO tensor, a draft
model loaded as GenAI's draft_model, and the paged KV cache pool committed at load (kv_pool.py).

Copied beside model.py by render; imports numpy, openvino, openvino_genai and its siblings only.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import openvino as ov
import openvino_genai as ov_genai
from engine_adapter import DraftModel
from kv_pool import warm_up_and_commit

ENGINE_VERSION = f"OpenVINO GenAI {ov_genai.__version__}"
GenerationStatus = ov_genai.GenerationStatus
GenerationConfig = ov_genai.GenerationConfig
SchedulerConfig = ov_genai.SchedulerConfig


class Pipeline:
    """GenAI's ContinuousBatchingPipeline taking the prompt as token ids."""

    def __init__(self, genai: Any) -> None:
        self.genai = genai

    def add_request(self, request_id: int, prompt: list[int], config: Any) -> Any:
        return self.genai.add_request(request_id, ov.Tensor(np.asarray([prompt], dtype=np.int64)), config)

    def step(self) -> None:
        self.genai.step()

    def has_non_finished_requests(self) -> bool:
        return bool(self.genai.has_non_finished_requests())


def load(engine_dir: str, scheduler: Any, properties: dict[str, str], draft: DraftModel | None) -> Pipeline:
    compile_properties: dict[str, Any] = dict(properties)
    if draft is not None:
        compile_properties["draft_model"] = ov_genai.draft_model(draft.directory, "CPU", **draft.properties)
    return Pipeline(ov_genai.ContinuousBatchingPipeline(engine_dir, scheduler, "CPU", compile_properties))


def warm_up(pipeline: Pipeline, sequences: int, num_assistant_tokens: int) -> str:
    return warm_up_and_commit(pipeline.genai, ov_genai, sequences, num_assistant_tokens)
