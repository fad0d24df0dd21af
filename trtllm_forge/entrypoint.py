"""Which served model clients call, and in which tensor contract: one definition for smoke, verify and bench."""

from __future__ import annotations

from trtllm_forge.config.schema import ForgeConfig


def is_llmapi(config: ForgeConfig) -> bool:
    """The repository is NVIDIA's llmapi model (text_input, sampling_param_*, streaming → text_output)."""
    return config.engine.target == "llmapi"


def entry_model(config: ForgeConfig) -> str:
    names = config.triton.model_names
    if is_llmapi(config):
        return names.tensorrt_llm
    return names.ensemble if config.triton.entrypoint == "ensemble" else names.bls
