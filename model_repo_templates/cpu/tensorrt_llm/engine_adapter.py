"""The contract between the CPU engine model (model.py beside this file) and a CPU engine: what trtllm-forge asks of
an engine it serves on the CPU, defined here rather than borrowed from one engine's own API.

An adapter is a module beside model.py (`openvino_engine.py`, `ort_engine.py`) providing `EngineAdapter`'s names.
The engine's builder records the module's name in the engine directory's config.json (`"adapter"`, the descriptor's
`served_adapter`, builders/<name>/engine.py), and model.py imports the module by that name (`load_adapter`).

model.py runs one engine loop per instance: `load` the engine, then `add_request(id, prompt ids, config)` per
sequence (a `RequestHandle`), `step()` while `has_non_finished_requests()`, and after each step every handle's
`get_status()` (one of the adapter's `GenerationStatus` members), `can_read()` / `read()` (new tokens) and `stop()`.
Sampling settings go on the adapter's `GenerationConfig()` (genai_settings.py sets them; `validate()` refuses what the
engine cannot honour), scheduler limits on its `SchedulerConfig()`.

Standard library only: render copies it beside model.py (render/templates.py), where the Triton python stub imports it.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

# What model.py reads from an adapter module (EngineAdapter's members), checked when the adapter is loaded.
ADAPTER_NAMES = ("ENGINE_VERSION", "GenerationStatus", "GenerationConfig", "SchedulerConfig", "load", "warm_up")
# Members model.py compares a handle's status with.
STATUS_NAMES = ("RUNNING", "FINISHED", "IGNORED", "STOP", "CANCEL")


@dataclass(frozen=True)
class DraftModel:
    """Draft-target speculative decoding: the draft model's directory and its own compile properties."""

    directory: str
    properties: dict[str, str] = field(default_factory=dict)


class GenerationOutput(Protocol):
    generated_ids: Sequence[int]
    generated_log_probs: Sequence[float]


class RequestHandle(Protocol):
    """One sequence inside the engine."""

    def get_status(self) -> Any:
        """One of the adapter's GenerationStatus members: RUNNING, FINISHED, IGNORED (refused or failed: the
        request is answered with an error), STOP (stopped by `stop()`), CANCEL."""
        ...

    def can_read(self) -> bool: ...

    def read(self) -> Mapping[int, GenerationOutput]:
        """The tokens generated since the last read (and their log probabilities), keyed by output index."""
        ...

    def stop(self) -> None:
        """End the sequence at the next step; what was generated stays readable."""
        ...


class Pipeline(Protocol):
    """The engine: continuous batching over the requests added to it."""

    def add_request(self, request_id: int, prompt: list[int], config: Any) -> RequestHandle:
        """Raises (any exception: model.py answers the request with its first line) for what the engine refuses."""
        ...

    def step(self) -> None: ...

    def has_non_finished_requests(self) -> bool: ...


class EngineAdapter(Protocol):
    """The names an adapter module provides (a module satisfies this protocol)."""

    ENGINE_VERSION: str  # the engine library and its version, for the load log line
    GenerationStatus: Any  # an enum with STATUS_NAMES members
    GenerationConfig: Any  # a class: GenerationConfig() takes the sampling fields model.py sets, validate() checks them
    SchedulerConfig: Any  # a class: num_kv_blocks, max_num_seqs, max_num_batched_tokens, enable_prefix_caching, dynamic_split_fuse

    def load(self, engine_dir: str, scheduler: Any, properties: dict[str, str], draft: DraftModel | None) -> Pipeline:
        """The engine of `engine_dir` on the CPU, with these scheduler limits and runtime properties (raises for a
        draft model it cannot run)."""
        ...

    def warm_up(self, pipeline: Pipeline, sequences: int, num_assistant_tokens: int) -> str:
        """Whatever the engine does once before the first client's request (OpenVINO: commit the KV pool); a log line."""
        ...


def load_adapter(name: object) -> EngineAdapter:
    """The adapter module an engine's config.json names (`"adapter"`), checked to provide EngineAdapter's names."""
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f'the engine\'s config.json names no adapter ("adapter": {name!r}); rebuild the engine with this trtllm-forge')
    module = importlib.import_module(name)
    missing = [member for member in ADAPTER_NAMES if not hasattr(module, member)]
    missing += [f"GenerationStatus.{member}" for member in STATUS_NAMES if not hasattr(getattr(module, "GenerationStatus", None), member)]
    if missing:
        raise ValueError(f"adapter {name} ({module.__file__}) lacks {', '.join(missing)} (see engine_adapter.py)")
    adapter: EngineAdapter = module  # its names checked above
    return adapter
