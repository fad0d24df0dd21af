"""What an engine backend is, declared once in its own package (`builders/<name>/engine.py`) and listed in
`builders/engines.py`: the schema's backend list, the CPU limits the config checks apply, the default dtype, the
adapter the CPU engine model loads, plan notes, the versions `version` and `doctor` report, and the scorer verify
loads it with are all read from here.

Standard library only: `config/schema.py` and `config/checks.py` read the descriptors, so nothing here may import
the config (or anything that does).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class CpuLimits:
    """What a CPU engine serves; the config rule `cpu_backend_supports` refuses everything else, naming the field."""

    algorithms: tuple[str, ...]  # quantization.algorithm values
    kv_caches: tuple[str, ...]  # quantization.kv_cache values
    speculative_modes: tuple[str, ...]  # engine.speculative.mode values
    kv_cache_types: tuple[str, ...]  # engine.kv_cache_type values
    kv_cache_layout: str  # how the engine keeps its KV cache, said when a setting needs another layout
    refused_runtime: tuple[str, ...] = ()  # runtime.* switches it cannot honour (they must stay false)


@dataclass(frozen=True)
class Component:
    """A Python distribution the engine runs on: `version` lists it, `doctor` checks it."""

    distribution: str
    needed_for: str  # the stages that need it, as doctor prints them
    required: bool  # by the default CPU chain (doctor's "cpu chain ready")
    doctor_row: bool = True  # False: doctor checks it with a probe of its own (trtllm_forge/doctor.py)


@dataclass(frozen=True)
class EngineDescriptor:
    backend: str  # the config's engine.backend value
    title: str  # the engine's name in messages
    on_cpu: bool  # served by the `cpu` repository kind's engine model (else a GPU engine)
    default_dtype: str  # model.dtype auto with no checkpoint to read (trtllm_forge/dtypes.py)
    # engine.target → the builder class as "package.module:Class" (builders/registry.py imports it when used)
    builders: Mapping[str, str]
    # config rules of this engine alone: "package.module:function" taking config/checks.py's CheckContext and
    # yielding ConfigErrors; imported only when a config names this backend
    config_rules: str | None = None
    limits: CpuLimits | None = None  # on_cpu engines: what the CPU engine model serves with it
    # The module beside model_repo_templates/cpu/tensorrt_llm/model.py implementing engine_adapter.py's protocol;
    # the builder records it in the engine's config.json ("adapter"), model.py imports it by that name.
    served_adapter: str | None = None
    # A line `plan` adds for this engine; str.format fields: kv_bytes, cpu_inference_precision, kv_tokens
    # (max_batch_size * the effective max_seq_len).
    plan_note: str | None = None
    components: tuple[Component, ...] = field(default_factory=tuple)
    # Which verify engine scorer loads this engine in process (None: verify cannot load it here).
    verify_scorer: str | None = None

    def __post_init__(self) -> None:
        if self.on_cpu and (self.limits is None or self.served_adapter is None):
            raise ValueError(f"{self.backend}: a CPU engine declares its limits and its served adapter")
