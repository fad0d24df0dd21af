"""The engine directory contract: `<engine_dir>/config.json` as TensorRT-LLM 1.2.x writes it
(`version`, `pretrained_config`, `build_config` with `plugin_config`).

`render` reads engine-bound values only through `EngineInfo`, so a TensorRT-LLM engine and our CPU engines
(whose builders write the same shape, plus `backend` and the CPU engine model's `adapter`) are treated alike.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtllm_forge.builders.descriptor import EngineDescriptor
from trtllm_forge.builders.tensorrt_llm.engine import ENGINE as TENSORRT_LLM
from trtllm_forge.errors import ConfigError

ENGINE_CONFIG = "config.json"
ADAPTER_KEY = "adapter"  # the served adapter the CPU engine model imports (model_repo_templates/cpu/tensorrt_llm/model.py)

# build_config.speculative_decoding_mode as TensorRT-LLM serializes it (enum name or flag value).
SPECULATIVE_MODE_NAMES = {
    1: "NONE",
    2: "DRAFT_TOKENS_EXTERNAL",
    4: "MEDUSA",
    8: "LOOKAHEAD_DECODING",
    16: "EXPLICIT_DRAFT_TOKENS",
    32: "EAGLE",
}


@dataclass(frozen=True)
class EngineInfo:
    """What the serving side must agree with, read from an engine's config.json."""

    directory: Path
    version: str
    backend: str  # engine.backend of the builder that wrote it (builders/engines.py)
    architecture: str
    dtype: str
    logits_dtype: str
    vocab_size: int
    tp_size: int
    pp_size: int
    max_batch_size: int
    max_beam_width: int
    max_input_len: int
    max_seq_len: int
    max_num_tokens: int
    gather_context_logits: bool
    gather_generation_logits: bool
    speculative_decoding_mode: str
    max_draft_len: int
    paged_kv_cache: bool
    tokens_per_block: int
    use_paged_context_fmha: bool
    lora_plugin: bool
    raw: dict

    @property
    def world_size(self) -> int:
        return self.tp_size * self.pp_size


def _get(data: dict, *keys: str, default: Any = None) -> Any:
    for key in keys:
        if not isinstance(data, dict) or key not in data:
            return default
        data = data[key]
    return data


def _speculative_name(value: Any) -> str:
    if value is None:
        return "NONE"
    if isinstance(value, int):
        return SPECULATIVE_MODE_NAMES.get(value, str(value))
    return str(value).split(".")[-1].upper()


def _plugin_enabled(value: Any) -> bool:
    """Plugin fields hold a dtype string, 'auto', None or a bool; 'disable'/None/False mean off."""
    return value not in (None, False, "disable", "")


def read_engine_config(engine_dir: Path) -> EngineInfo:
    path = Path(engine_dir) / ENGINE_CONFIG
    if not path.is_file():
        raise ConfigError("--engine-dir", f"{path} does not exist", "pass a directory holding an engine config.json")
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ConfigError(str(path), f"not valid JSON ({exc.msg} at line {exc.lineno})", "rebuild the engine") from None
    pretrained = raw.get("pretrained_config")
    build = raw.get("build_config")
    if not isinstance(pretrained, dict) or not isinstance(build, dict):
        raise ConfigError(str(path), "missing pretrained_config or build_config", "is this a TensorRT-LLM 1.x engine directory?")
    plugin = build.get("plugin_config") or {}
    kv_type = str(build.get("kv_cache_type") or ("PAGED" if plugin.get("paged_kv_cache", True) else "CONTINUOUS"))
    try:
        return EngineInfo(
            directory=Path(engine_dir),
            version=str(raw.get("version", "unknown")),
            backend=str(raw.get("backend", TENSORRT_LLM.backend)),  # TensorRT-LLM's own config.json has no "backend"
            architecture=str(pretrained.get("architecture", "")),
            dtype=str(pretrained.get("dtype", "float16")),
            logits_dtype=str(pretrained.get("logits_dtype", "float32")),
            vocab_size=int(pretrained["vocab_size"]),
            tp_size=int(_get(pretrained, "mapping", "tp_size", default=1)),
            pp_size=int(_get(pretrained, "mapping", "pp_size", default=1)),
            max_batch_size=int(build["max_batch_size"]),
            max_beam_width=int(build.get("max_beam_width", 1)),
            max_input_len=int(build.get("max_input_len", 1024)),
            max_seq_len=int(build["max_seq_len"]),
            max_num_tokens=int(build.get("max_num_tokens") or 8192),
            gather_context_logits=bool(build.get("gather_context_logits", False)),
            gather_generation_logits=bool(build.get("gather_generation_logits", False)),
            speculative_decoding_mode=_speculative_name(build.get("speculative_decoding_mode")),
            max_draft_len=int(build.get("max_draft_len", 0)),
            paged_kv_cache=kv_type.split(".")[-1].upper() == "PAGED",
            tokens_per_block=int(plugin.get("tokens_per_block", 32)),
            use_paged_context_fmha=bool(plugin.get("use_paged_context_fmha", False)),
            lora_plugin=_plugin_enabled(plugin.get("lora_plugin")),
            raw=raw,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(str(path), f"unexpected engine config ({type(exc).__name__}: {exc})", "rebuild the engine") from None


def write_engine_config(
    engine_dir: Path,
    *,
    version: str,
    engine: EngineDescriptor,
    pretrained_config: dict,
    build_config: dict,
    extra: dict | None = None,
) -> Path:
    """Write config.json in TensorRT-LLM's shape; `backend`, `adapter` (the engine's served adapter, when it has one)
    and `extra` are our own additions."""
    data = {"version": version, "backend": engine.backend, "pretrained_config": pretrained_config, "build_config": build_config}
    if engine.served_adapter:
        data[ADAPTER_KEY] = engine.served_adapter
    data.update(extra or {})
    path = Path(engine_dir) / ENGINE_CONFIG
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    return path
