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
    "model": {
        "source": "/models/Llama-3.1-8B-Instruct",
        "name": "meta-llama/Llama-3.1-8B-Instruct",
        "family": "llama",
        "dtype": "bfloat16",
    },
    "engine": {
        "backend": "tensorrt-llm",
        "target": "engine",
        "max_batch_size": 8,
        "max_input_len": 1024,
        "max_seq_len": 2048,
        "max_num_tokens": 4096,
    },
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


# The GPU examples that build trtllm-build engines (the others use engine.target: llmapi).
ENGINE_CONFIGS = [p for p in GPU_CONFIGS if example(p).engine.target == "engine"]
LLMAPI_CONFIGS = [p for p in GPU_CONFIGS if example(p).engine.target == "llmapi"]


def eagle_engine_example() -> ForgeConfig:
    """The Llama-3.1-8B EAGLE example on the 1.2.x engine path (BF16: the EAGLE converter cannot quantize)."""
    import yaml

    data = yaml.safe_load((REPO / "configs/llama3.1-8b-fp8-h100.yaml").read_text())
    data["engine"]["target"] = "engine"
    data["model"]["source"] = "/models/Llama-3.1-8B-Instruct"
    data["engine"]["speculative"]["draft_model"] = "/models/EAGLE-LLaMA3.1-Instruct-8B"
    # The engine path's EAGLE-1 tree (the LLM-API example drafts linearly; choices are refused there).
    data["engine"]["speculative"]["max_draft_len"] = 63
    data["engine"]["speculative"]["choices"] = "[[0],[0,0],[1],[0,1],[2],[0,0,0],[1,0],[0,2],[3],[0,3]]"
    data["runtime"]["decoding_mode"] = "eagle"
    data["quantization"] = {"algorithm": "none", "kv_cache": "none"}
    data["engine"].setdefault("plugins", {})["fp8_context_fmha"] = False
    return ForgeConfig.model_validate(data)


DRAFT_ENGINES = REPO / "tests" / "fixtures" / "draft_engines"


def draft_engine_fixture(example: str):
    """The draft engine of a draft-target example (tests/fixtures/draft_engines/<example>/config.json: the config.json
    build-draft is expected to write, from engine_fixture.expected_engine_config of the draft's plan), else None."""
    from trtllm_forge.engine_config import read_engine_config
    from trtllm_forge.render.draft import DraftEngine

    directory = DRAFT_ENGINES / example
    return DraftEngine(directory.resolve(), read_engine_config(directory)) if directory.is_dir() else None
