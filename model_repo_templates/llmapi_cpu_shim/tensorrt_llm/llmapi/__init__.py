"""NOT TensorRT-LLM: `tensorrt_llm.llmapi` of trtllm-forge's CPU stand-in (see the package's __init__)."""

from trtllm_forge.llmapi_cpu import LLM, CompletionOutput, RequestOutput, SamplingParams

__all__ = ["LLM", "CompletionOutput", "RequestOutput", "SamplingParams"]
