"""How verify scores a quantized engine, per engine backend: the one place that says which engines verify can load
in-process for their perplexity, and why the others cannot be.

An engine verify can load is scored on the same local text, in the same windows, as the reference model
(`reference.text_perplexity`); its perplexity is held to `verify.max_perplexity_increase`. An engine it cannot load
is reported as not checked, with the reason: verify then rests on token agreement alone and says so.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from trtllm_forge.builders.engines import BY_BACKEND
from trtllm_forge.config.schema import ForgeConfig
from trtllm_forge.verify.reference import Perplexity


@dataclass(frozen=True)
class Unscorable:
    """An engine backend verify cannot load, and why."""

    reason: str


EnginePerplexity = Callable[[ForgeConfig, Path], Perplexity]


def openvino_perplexity(config: ForgeConfig, engine_dir: Path) -> Perplexity:
    from trtllm_forge.verify.openvino_engine import OpenVINOEngineModel

    return OpenVINOEngineModel(engine_dir, config.engine.cpu_inference_precision).perplexity()


def onnxruntime_perplexity(config: ForgeConfig, engine_dir: Path) -> Perplexity:
    from trtllm_forge.verify.onnxruntime_engine import OnnxRuntimeEngineModel

    return OnnxRuntimeEngineModel(engine_dir).perplexity()


# Keyed by the name an engine's descriptor gives as its `verify_scorer` (builders/<name>/engine.py).
SCORERS: dict[str, EnginePerplexity] = {
    "openvino": openvino_perplexity,
    "onnxruntime": onnxruntime_perplexity,
}


def engine_scorer(backend: str) -> EnginePerplexity | Unscorable:
    """How verify scores an engine.backend's engines: its descriptor's scorer, or why it cannot."""
    descriptor = BY_BACKEND.get(backend)
    if descriptor is None:
        return Unscorable(f"verify has no in-process loader for {backend!r} engines")
    if descriptor.verify_scorer is None:
        needs = "" if descriptor.on_cpu else f" (it needs a GPU and the {descriptor.title} runtime)"
        return Unscorable(f"verify cannot load a {descriptor.title} engine in-process{needs}")
    return SCORERS[descriptor.verify_scorer]
