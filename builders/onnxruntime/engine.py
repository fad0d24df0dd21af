"""The ONNX Runtime GenAI engine, as the rest of trtllm-forge knows it (see builders/descriptor.py). Standard library only."""

from __future__ import annotations

from trtllm_forge.builders.descriptor import Component, CpuLimits, EngineDescriptor

# quantization.algorithm → the model builder's --precision (builders/onnxruntime/plan.py); its keys are the
# algorithms this engine offers.
PRECISIONS = {"none": "fp32", "int8_wo": "int8", "int4_wo": "int4"}

ENGINE = EngineDescriptor(
    backend="onnxruntime",
    title="ONNX Runtime GenAI",
    on_cpu=True,
    default_dtype="float32",  # the CPU execution provider computes in fp32
    # No llmapi target: the CPU LLM-API stand-in serves OpenVINO IR only.
    builders={"engine": "trtllm_forge.builders.onnxruntime.builder:OnnxRuntimeBuilder"},
    # fp32/int8/int4 weights, an fp32 KV cache of max_seq_len per sequence, no speculative decoding.
    limits=CpuLimits(
        algorithms=tuple(PRECISIONS),
        kv_caches=("none",),
        speculative_modes=("none",),
        kv_cache_types=("paged", "continuous", "disabled"),  # engine.kv_cache_type does not shape its build
        kv_cache_layout="keeps a contiguous KV cache per sequence",
        refused_runtime=("enable_kv_cache_reuse", "enable_chunked_context"),
    ),
    served_adapter="ort_engine",
    plan_note="ONNX Runtime GenAI reserves a contiguous KV buffer of max_seq_len per sequence: {kv_tokens} tokens",
    components=(
        Component("onnxruntime-genai", "engine.backend: onnxruntime (build, deploy)", required=False),
        Component("onnxruntime", "engine.backend: onnxruntime (build, deploy)", required=False),
    ),
    verify_scorer="onnxruntime",
)
