"""Configuration: schema, loading with friendly errors, cross-field checks."""

from trtllm_forge.config.load import load_config
from trtllm_forge.config.schema import ForgeConfig

__all__ = ["ForgeConfig", "load_config"]
