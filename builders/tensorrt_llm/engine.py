"""The TensorRT-LLM engine, as the rest of trtllm-forge knows it (see builders/descriptor.py). Standard library only."""

from __future__ import annotations

from trtllm_forge.builders.descriptor import Component, EngineDescriptor

ENGINE = EngineDescriptor(
    backend="tensorrt-llm",
    title="TensorRT-LLM",
    on_cpu=False,
    default_dtype="bfloat16",  # what the catalog's GPU models ship in (the catalog records no dtype)
    builders={
        "engine": "trtllm_forge.builders.tensorrt_llm.execute:TensorRTLLMEngineBuilder",
        "llmapi": "trtllm_forge.builders.tensorrt_llm.execute:LLMAPIBuilder",
    },
    # The spec's GPU compute-capability rules for quantization, checked when the config is loaded.
    config_rules="trtllm_forge.builders.tensorrt_llm.rules:config_problems",
    # Its version comes from package metadata (importing tensorrt_llm would initialise CUDA); doctor checks it
    # with its own probe (builders/tensorrt_llm/container.py trtllm_version), so no doctor row from here.
    components=(
        Component("tensorrt_llm", "engine.backend: tensorrt-llm (build-engine on this machine)", required=False, doctor_row=False),
    ),
    verify_scorer=None,  # no GPU here: verify cannot load a TensorRT-LLM engine in process
)
