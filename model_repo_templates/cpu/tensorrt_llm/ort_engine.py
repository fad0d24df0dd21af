"""ONNX Runtime GenAI behind the CPU engine adapter protocol (engine_adapter.py) that the CPU engine model (model.py)
drives.

model.py runs one engine loop: `add_request(id, prompt ids, GenerationConfig)` returns a handle, `step()` advances
every scheduled request by one token, and each handle is polled with `get_status()`, `can_read()`, `read()` and
stopped with `stop()`. This module gives those calls over `onnxruntime_genai.Engine`; the builder of
`engine.backend: onnxruntime` records its name in the engine's config.json (`"adapter": "ort_engine"`), so model.py
loads it:

    ContinuousBatchingPipeline(engine_dir, SchedulerConfig, "CPU", properties)
        → og.Model (CPU provider) + og.Engine; one og.Request per sequence, begun with og.TurnOptions
    step()  → Engine.run(event buffer): one forward pass; TOKEN / TURN_FINISHED / FAILED events per request
    stop()  → Request.cancel_turn

Batching is what ONNX Runtime GenAI's Engine does on CPU: without a paged-attention model (a CUDA-only export),
it batches statically: requests waiting together start together, up to `engine.static_batching.max_batch_size`
(the build writes max_batch_size there), and later requests wait until that batch has finished.

Sampling parameters this engine cannot honour are refused by `GenerationConfig.validate()` (model.py turns that
into INVALID_ARG for the request): per-request seeds, presence/frequency penalties and log probabilities.

Self-contained on purpose (numpy, onnxruntime_genai and engine_adapter.py only): it is copied beside model.py into
the repository.
"""

from __future__ import annotations

import enum
import json
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnxruntime_genai as og
from engine_adapter import DraftModel

ENGINE_VERSION = f"ONNX Runtime GenAI {og.__version__}"
EVENT_BUFFER_CAPACITY = 1024


class GenerationStatus(enum.Enum):
    RUNNING = 0
    FINISHED = 1
    IGNORED = 2  # refused or failed by the engine: model.py answers the request with an error
    STOP = 3
    CANCEL = 4


@dataclass
class SchedulerConfig:
    """OpenVINO GenAI's scheduler fields model.py sets. Only max_num_seqs matters here (it must not exceed the
    batch the build wrote into genai_config.json); the KV cache is one contiguous buffer per sequence."""

    num_kv_blocks: int = 0
    max_num_seqs: int = 1
    max_num_batched_tokens: int = 0
    enable_prefix_caching: bool = False
    dynamic_split_fuse: bool = False


@dataclass
class GenerationConfig:
    """The sampling fields of OpenVINO GenAI's GenerationConfig that model.py sets, mapped onto og.TurnOptions."""

    max_new_tokens: int = 0
    min_new_tokens: int = 0
    ignore_eos: bool = False
    eos_token_id: int = -1
    stop_token_ids: set[int] = field(default_factory=set)
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    rng_seed: int | None = None
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logprobs: int = 0

    def validate(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens is {self.max_new_tokens}; must be >= 1")
        if self.rng_seed is not None:
            raise ValueError("seed: per-request seeds need ONNX Runtime GenAI's dynamic batching (a CUDA paged-attention model)")
        if self.presence_penalty or self.frequency_penalty:
            raise ValueError("presence_penalty/frequency_penalty: not available on the onnxruntime engine; send 0")
        if self.logprobs:
            raise ValueError("return_log_probs: log probabilities are not returned by the onnxruntime engine; send false")
        if self.repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty is {self.repetition_penalty}; must be > 0")


@dataclass
class GenerationOutput:
    generated_ids: list[int]
    generated_log_probs: list[float]


class RequestHandle:
    """One sequence in the engine: model.py's view of it (status, new tokens, stop)."""

    def __init__(self, request: Any, turn_id: int, config: GenerationConfig, model_eos: int | None):
        self.request = request
        self.turn_id = turn_id
        self.config = config
        self.status = GenerationStatus.RUNNING
        self.unread: list[int] = []
        self.generated = 0
        # The engine itself stops at the model's EOS token; other end ids and stop tokens are checked here.
        self.model_eos = model_eos

    def get_status(self) -> GenerationStatus:
        return self.status

    def can_read(self) -> bool:
        return bool(self.unread)

    def read(self) -> dict[int, GenerationOutput]:
        tokens, self.unread = self.unread, []
        return {0: GenerationOutput(tokens, [0.0] * len(tokens))}

    def stop(self) -> None:
        if self.status is GenerationStatus.RUNNING:
            self.status = GenerationStatus.STOP
            self.request.cancel_turn(self.turn_id)

    def on_token(self, token: int, last: bool) -> None:
        """A generated token; `last` when the engine ended the turn with it (max tokens or the model's EOS)."""
        if self.status is not GenerationStatus.RUNNING:
            return
        self.unread.append(token)
        self.generated += 1
        config = self.config
        if last or self.generated < config.min_new_tokens:
            return
        if token in config.stop_token_ids or (token == config.eos_token_id and not config.ignore_eos):
            self.status = GenerationStatus.FINISHED
            self.request.cancel_turn(self.turn_id)

    def on_finished(self, failed: bool) -> None:
        if self.status is GenerationStatus.RUNNING:
            self.status = GenerationStatus.IGNORED if failed else GenerationStatus.FINISHED


def _turn_options(request: Any, config: GenerationConfig) -> Any:
    options = og.TurnOptions(request)
    options.set_max_generated_tokens(config.max_new_tokens)
    # ignore_eos (end_id -1 or an id outside the vocabulary): the model's EOS is masked for the whole output.
    minimum = config.max_new_tokens if config.ignore_eos else config.min_new_tokens
    if minimum:
        options.set_min_generated_tokens(minimum)
    options.set_do_sample(bool(config.do_sample))
    if config.do_sample:
        options.set_temperature(float(config.temperature))
        options.set_top_k(int(config.top_k))
        options.set_top_p(float(config.top_p))
    if config.repetition_penalty != 1.0:
        options.set_repetition_penalty(float(config.repetition_penalty))
    return options


def _genai_config(engine_dir: str) -> dict:
    with open(os.path.join(engine_dir, "genai_config.json")) as handle:
        return json.load(handle)


def _model_eos(genai: dict) -> int | None:
    eos = genai.get("model", {}).get("eos_token_id")
    if isinstance(eos, list):
        return int(eos[0]) if eos else None
    return None if eos is None else int(eos)


class ContinuousBatchingPipeline:
    """og.Engine with OpenVINO GenAI's ContinuousBatchingPipeline calls (see the module docstring)."""

    def __init__(self, engine_dir: str, scheduler: SchedulerConfig, device: str = "CPU", properties: dict | None = None):
        if device != "CPU":
            raise ValueError(f"device {device!r}: the onnxruntime engine model runs on the CPU")
        config = og.Config(engine_dir)
        config.clear_providers()  # the CPU execution provider
        self.model = og.Model(config)
        genai = _genai_config(engine_dir)
        # Absent: the engine's own default batch; the build always writes it.
        self.max_batch_size = genai.get("engine", {}).get("static_batching", {}).get("max_batch_size")
        if self.max_batch_size is not None and scheduler.max_num_seqs > self.max_batch_size:
            raise ValueError(
                f"max_num_seqs {scheduler.max_num_seqs} exceeds the engine's static batch {self.max_batch_size} "
                "(engine.static_batching.max_batch_size in genai_config.json); rebuild the engine"
            )
        self.model_eos = _model_eos(genai)
        self.handles: dict[int, RequestHandle] = {}  # id(og.Request) → handle; pybind returns the same wrapper
        self._engine: Any = None

    @property
    def engine(self) -> Any:
        """og.Engine is bound to the thread that creates it: made on first use, by model.py's engine loop thread."""
        if self._engine is None:
            self._engine = og.Engine(self.model)
            self.buffer = self._engine.create_event_buffer(EVENT_BUFFER_CAPACITY)
        return self._engine

    def add_request(self, request_id: int, input_ids: Any, config: GenerationConfig) -> RequestHandle:
        ids = np.asarray(getattr(input_ids, "data", input_ids), dtype=np.int32).reshape(-1)
        config.validate()
        request = self.engine.create_request()
        turn_id = request.begin_turn(ids, _turn_options(request, config))
        handle = RequestHandle(request, turn_id, config, self.model_eos)
        self.handles[id(request)] = handle
        return handle

    def has_non_finished_requests(self) -> bool:
        return bool(self.engine.has_pending_requests())

    def step(self) -> None:
        if not self.engine.has_pending_requests():
            return
        for event in self.engine.run(self.buffer):
            handle = self.handles.get(id(event.request))
            if handle is None:
                continue
            flags = int(event.flags)
            failed = bool(flags & int(og.EngineEventFlags.FAILED))
            finished = bool(flags & int(og.EngineEventFlags.TURN_FINISHED))
            if flags & int(og.EngineEventFlags.TOKEN):
                handle.on_token(int(event.token), last=finished)
            elif finished and event.finish_reason == og.FinishReason.EOS and self.model_eos is not None:
                # The engine ends at the model's EOS without a token event; OpenVINO GenAI (and so this model's
                # contract) returns the EOS token as the last output token.
                handle.on_token(self.model_eos, last=True)
            if failed or finished:
                handle.on_finished(failed)
                self.handles.pop(id(event.request), None)
                event.request.close()


def load(engine_dir: str, scheduler: SchedulerConfig, properties: dict[str, str], draft: DraftModel | None) -> ContinuousBatchingPipeline:
    """OpenVINO runtime properties (properties) do not apply to this engine; draft-target decoding is not offered."""
    if draft is not None:
        raise ValueError(f"a draft model ({draft.directory}): the onnxruntime engine does not serve speculative decoding")
    return ContinuousBatchingPipeline(engine_dir, scheduler, "CPU", properties)


def warm_up(pipeline: ContinuousBatchingPipeline, sequences: int, num_assistant_tokens: int) -> str:
    """Nothing to commit: ONNX Runtime GenAI has no paged pool, its KV cache is one buffer per sequence, made per request."""
    return "no warm-up (the KV cache is made per request)"
