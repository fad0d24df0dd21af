"""Every engine backend trtllm-forge knows: one line per backend, its descriptor from its own package.

The schema's `engine.backend` values, `CPU_BACKENDS`, the builder table (builders/registry.py), the CPU limits the
config checks apply, the default dtypes, the adapters render copies beside the CPU engine model and the versions
`version` and `doctor` report are all derived from ENGINES. Standard library only below this line's imports: the
config reads it (see builders/descriptor.py).
"""

from __future__ import annotations

from trtllm_forge.builders.descriptor import Component, EngineDescriptor
from trtllm_forge.builders.onnxruntime.engine import ENGINE as ONNXRUNTIME
from trtllm_forge.builders.openvino.engine import ENGINE as OPENVINO
from trtllm_forge.builders.tensorrt_llm.engine import ENGINE as TENSORRT_LLM

ENGINES: tuple[EngineDescriptor, ...] = (TENSORRT_LLM, OPENVINO, ONNXRUNTIME)

BY_BACKEND = {engine.backend: engine for engine in ENGINES}
BACKENDS = tuple(BY_BACKEND)  # engine.backend values, the schema's default (tensorrt-llm) first
CPU_BACKENDS = tuple(engine.backend for engine in ENGINES if engine.on_cpu)
# The adapter modules render copies beside the CPU engine model (model_repo_templates/cpu/tensorrt_llm/<name>.py).
CPU_ADAPTERS = tuple(engine.served_adapter for engine in ENGINES if engine.served_adapter)


def engine_of(backend: str) -> EngineDescriptor:
    """The descriptor of an engine.backend value (the schema admits only BACKENDS)."""
    return BY_BACKEND[backend]


def engine_components() -> tuple[Component, ...]:
    """Every engine's Python distributions, in ENGINES order."""
    return tuple(component for engine in ENGINES for component in engine.components)
