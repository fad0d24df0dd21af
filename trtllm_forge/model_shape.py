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
    def from_hf_config(cls, cfg: dict, origin: str) -> ModelShape:
        def count(key: str, default: int | None = None, minimum: int = 1) -> int:
            return _count(cfg, key, origin, default, minimum)

        heads = count("num_attention_heads")
        hidden = count("hidden_size")
        return cls(
            model_type=str(cfg.get("model_type", "")),
            num_hidden_layers=count("num_hidden_layers"),
            hidden_size=hidden,
            num_attention_heads=heads,
            num_key_value_heads=count("num_key_value_heads", heads) if cfg.get("num_key_value_heads") else heads,
            head_dim=count("head_dim", hidden // heads) if cfg.get("head_dim") else hidden // heads,
            intermediate_size=count("intermediate_size", 0, minimum=0),
            vocab_size=count("vocab_size"),
            max_position_embeddings=count("max_position_embeddings", 0, minimum=0),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            rope_scaling=cfg.get("rope_scaling"),
            num_local_experts=count("num_local_experts", 0, minimum=0) if cfg.get("num_local_experts") else 0,
            num_experts_per_tok=count("num_experts_per_tok", 0, minimum=0) if cfg.get("num_experts_per_tok") else 0,
            origin=origin,
        )


MAX_COUNT = 1 << 40  # beyond any real layer count, width or vocabulary


def _count(cfg: dict, key: str, origin: str, default: int | None, minimum: int) -> int:
    """A whole-number field of config.json; KeyError when it is required and absent (shape unknown),
    ConfigError naming the file and field when it is present but not a count (0 heads, 1e400, "x")."""
    if key not in cfg:
        if default is None:
            raise KeyError(key)
        return default
    value = cfg[key]
    whole = (isinstance(value, int) and not isinstance(value, bool)) or (isinstance(value, float) and value.is_integer())
    if not whole or not minimum <= value <= MAX_COUNT:
        from trtllm_forge.config.yaml_reader import shorten
        from trtllm_forge.errors import ConfigError

        raise ConfigError(key, f"is {shorten(value)}", f"a whole number from {minimum} to {MAX_COUNT:,}", source=origin)
    return int(value)


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
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
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
