"""Shared helpers for the tests/test_trtllm_*.py files: GPU example configs and config builders."""

from __future__ import annotations

import copy
from pathlib import Path

from trtllm_forge.config.load import load_config
from trtllm_forge.config.schema import ForgeConfig

REPO = Path(__file__).resolve().parent.parent
GPU_CONFIGS = sorted(p for p in (REPO / "configs").glob("*.yaml") if "cpu" not in p.name)

BASE = {
    "name": "unit",
    "model": {"source": "/models/Llama-3.1-8B-Instruct", "name": "meta-llama/Llama-3.1-8B-Instruct", "family": "llama", "dtype": "bfloat16"},
    "engine": {"backend": "tensorrt-llm", "max_batch_size": 8, "max_input_len": 1024, "max_seq_len": 2048, "max_num_tokens": 4096},
    "hardware": {"gpu": "H100-SXM"},
}


def merge(base: dict, overrides: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in overrides.items():
        out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def unchecked_config(**overrides) -> ForgeConfig:
    """A config validated field by field but NOT by the cross-field checks, so builder rules are tested alone."""
    return ForgeConfig.model_validate(merge(BASE, overrides))


def example(path: Path) -> ForgeConfig:
    return load_config(path)
