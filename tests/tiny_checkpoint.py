"""Tiny Llama checkpoints: a config.json alone (for tests that need a local Hugging Face directory but no weights)
and a real tiny model (for tests of what is done to a model, not of the model)."""

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


# write_tiny_model's layers (the vocabulary is the tokenizer's)
TINY_MODEL_SHAPE = {
    "num_hidden_layers": 2,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
}


def write_tiny_model(directory: Path, like: Path) -> Path:
    """A real, loadable checkpoint in `directory`: `like`'s config.json (a Hugging Face checkpoint: the session's
    SmolLM2) shrunk to 2 layers of width 64, with seeded random float32 weights and `like`'s tokenizer files.
    The vocabulary stays `like`'s (the tokenizer must cover it), so the embedding is most of its 3.2 M parameters.
    For tests whose subject is the export, not the model: an OpenVINO export of it takes a fraction of SmolLM2's."""
    import shutil

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(like)
    for key, value in TINY_MODEL_SHAPE.items():
        setattr(config, key, value)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(directory)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "chat_template.jinja"):
        if (like / name).is_file():
            shutil.copy(like / name, directory / name)
    return directory
