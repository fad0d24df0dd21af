"""A model's shape: the config.json facts that checks, templates and plans need.

Taken from the local checkpoint's config.json when there is one, else from the built-in catalog
(data/model_catalog.json) by `model.name`, so configs for GPU hosts can be checked here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path

BUILTIN_SOURCES = {"smollm2-135m": "HuggingFaceTB/SmolLM2-135M-Instruct"}


@dataclass(frozen=True)
class ModelShape:
    model_type: str
    num_hidden_layers: int
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    tie_word_embeddings: bool
    rope_scaling: dict | None
    num_local_experts: int = 0
    num_experts_per_tok: int = 0
    origin: str = ""

    @property
    def is_moe(self) -> bool:
        return self.num_local_experts > 1

    @classmethod
    def from_hf_config(cls, cfg: dict, origin: str) -> "ModelShape":
        heads = int(cfg["num_attention_heads"])
        return cls(
            model_type=str(cfg.get("model_type", "")),
            num_hidden_layers=int(cfg["num_hidden_layers"]),
            hidden_size=int(cfg["hidden_size"]),
            num_attention_heads=heads,
            num_key_value_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or cfg["hidden_size"] // heads),
            intermediate_size=int(cfg.get("intermediate_size", 0)),
            vocab_size=int(cfg["vocab_size"]),
            max_position_embeddings=int(cfg.get("max_position_embeddings", 0)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            rope_scaling=cfg.get("rope_scaling"),
            num_local_experts=int(cfg.get("num_local_experts") or 0),
            num_experts_per_tok=int(cfg.get("num_experts_per_tok") or 0),
            origin=origin,
        )


@lru_cache(maxsize=1)
def model_catalog() -> dict[str, dict]:
    raw = json.loads(resources.files("trtllm_forge").joinpath("data/model_catalog.json").read_text())
    return raw["models"]


def catalog_shape(model_id: str) -> ModelShape | None:
    entry = model_catalog().get(model_id)
    return ModelShape.from_hf_config(entry, origin=f"catalog:{model_id}") if entry else None


def shape_from_checkpoint_dir(directory: Path) -> ModelShape | None:
    config_file = directory / "config.json"
    if not config_file.is_file():
        return None
    try:
        return ModelShape.from_hf_config(json.loads(config_file.read_text()), origin=str(config_file))
    except (ValueError, KeyError, TypeError):
        return None  # incomplete or invalid config.json: shape unknown; `import` reports what is wrong


def resolve_shape(source: Path | str, model_name: str | None) -> ModelShape | None:
    """Local checkpoint config.json > built-in source > catalog entry by model name > unknown."""
    if isinstance(source, str) and source in BUILTIN_SOURCES:
        return catalog_shape(BUILTIN_SOURCES[source])
    path = Path(source)
    if path.is_dir():
        shape = shape_from_checkpoint_dir(path)
        if shape:
            return shape
    return catalog_shape(model_name) if model_name else None
