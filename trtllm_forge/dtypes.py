"""The model's dtype (`model.dtype`), resolved by one rule for every stage: import, plan and both engine builders.

    model.dtype set            → that dtype
    auto, a GGUF source        → float32: transformers dequantizes GGUF weights to float32 and the import keeps it
    auto, a checkpoint here    → what its config.json declares (`dtype`, or the older `torch_dtype`)
    auto, nothing readable     → the engine backend's default (its descriptor's `default_dtype`, builders/<name>/engine.py)

"A checkpoint here" is the imported checkpoint when a stage has one, else `model.source` when it is a directory
on this machine, so `plan` reads the same config.json that `build-engine` reads.
"""

from __future__ import annotations

import json
from pathlib import Path

from trtllm_forge.builders.engines import engine_of
from trtllm_forge.config import ForgeConfig
from trtllm_forge.config.schema import BUILTIN_MODELS

MODEL_DTYPES = ("float32", "float16", "bfloat16")
GGUF_DTYPE = "float32"


def declared_dtype(hf_config: dict) -> str | None:
    """The dtype a Hugging Face config.json declares; transformers >= 4.56 writes `dtype`, older ones `torch_dtype`."""
    declared = hf_config.get("dtype") or hf_config.get("torch_dtype")
    return str(declared) if declared else None


def stored_dtype(hf_config: dict, weight_dtypes: dict[str, int]) -> str:
    """What a checkpoint stores (recorded by the import): the declared dtype, else the dtype most weights have."""
    declared = declared_dtype(hf_config)
    if declared:
        return declared
    return max(weight_dtypes, key=lambda name: weight_dtypes[name]) if weight_dtypes else "unknown"


def checkpoint_dtype(checkpoint_dir: Path) -> str | None:
    """The model dtype a checkpoint directory's config.json declares; None when unreadable or not a model dtype."""
    try:
        hf_config = json.loads((Path(checkpoint_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    declared = declared_dtype(hf_config) if isinstance(hf_config, dict) else None
    return declared if declared in MODEL_DTYPES else None


def is_gguf(checkpoint: Path | str) -> bool:
    return str(checkpoint).lower().endswith(".gguf")


def source_is_gguf(config: ForgeConfig) -> bool:
    """model.source is a GGUF file: a .gguf path, or a built-in model (each is a GGUF file of an installed package,
    importer/sources.py BUILTIN_GGUF)."""
    return config.model.source in BUILTIN_MODELS or is_gguf(config.resolve_path(config.model.source))


def resolve_model_dtype(config: ForgeConfig, checkpoint: Path | None = None) -> str:
    """The dtype of the model's unquantized parts. `checkpoint`: the imported checkpoint directory when the caller
    has one (else model.source is looked at)."""
    if config.model.dtype != "auto":
        return config.model.dtype
    if checkpoint is not None:
        if is_gguf(checkpoint):
            return GGUF_DTYPE
        declared = checkpoint_dtype(checkpoint)
        if declared:
            return declared
    if source_is_gguf(config):
        return GGUF_DTYPE
    return checkpoint_dtype(config.resolve_path(config.model.source)) or engine_of(config.engine.backend).default_dtype
