"""The OpenVINO GenAI engine, as the rest of trtllm-forge knows it (see builders/descriptor.py). Standard library only."""

from __future__ import annotations

from trtllm_forge.builders.descriptor import Component, CpuLimits, EngineDescriptor

# quantization.algorithm → TensorRT-LLM's name for it (pretrained_config.quantization reads like a TRT-LLM engine's);
# the keys are the algorithms the export offers (builders/openvino/plan.py maps each to optimum-intel's weight format).
QUANT_ALGO_NAMES = {"none": None, "int8_wo": "W8A16", "int4_wo": "W4A16", "int4_awq": "W4A16_AWQ"}
KV_QUANT_ALGO_NAMES = {"none": None, "int8": "INT8"}  # quantization.kv_cache → KV_CACHE_PRECISION u8

ENGINE = EngineDescriptor(
    backend="openvino",
    title="OpenVINO GenAI",
    on_cpu=True,
    default_dtype="float32",  # the CPU engine's full precision
    builders={
        "engine": "trtllm_forge.builders.openvino.builder:OpenVINOBuilder",
        # On CPU the LLM-API stand-in loads the same OpenVINO IR; the builder also writes llmapi/model.yaml.
        "llmapi": "trtllm_forge.builders.openvino.builder:OpenVINOBuilder",
    },
    limits=CpuLimits(
        algorithms=tuple(QUANT_ALGO_NAMES),
        kv_caches=tuple(KV_QUANT_ALGO_NAMES),
        speculative_modes=("none", "draft_target", "prompt_lookup"),
        kv_cache_types=("paged",),
        kv_cache_layout="always uses a paged KV cache",
    ),
    served_adapter="openvino_engine",
    plan_note="KV cache assumed in {kv_bytes}-byte elements (cpu_inference_precision {cpu_inference_precision})",
    components=(
        Component("openvino", "build, deploy (CPU engine)", required=True),
        Component("openvino-genai", "build, deploy (CPU engine)", required=True),
    ),
    verify_scorer="openvino",
)
