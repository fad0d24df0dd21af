"""A tiny Llama checkpoint's config.json, for tests that need a local Hugging Face directory but no weights."""

from __future__ import annotations

import json
from pathlib import Path

TINY_LLAMA = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "num_hidden_layers": 2,
    "hidden_size": 256,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 512,
    "vocab_size": 1000,
    "max_position_embeddings": 4096,
}


def write_checkpoint_config(directory: Path, **changes) -> Path:
    """`directory`/config.json: TINY_LLAMA with `changes` (a value None drops that key); returns `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    values = {key: value for key, value in {**TINY_LLAMA, **changes}.items() if value is not None}
    (directory / "config.json").write_text(json.dumps(values))
    return directory
