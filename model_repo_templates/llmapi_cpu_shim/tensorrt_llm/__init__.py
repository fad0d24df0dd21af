"""NOT TensorRT-LLM: a shim that trtllm-forge places beside the llmapi model.py in CPU renderings only, so that
`from tensorrt_llm import LLM, SamplingParams` resolves to trtllm-forge's CPU stand-in (trtllm_forge.llmapi_cpu,
OpenVINO GenAI). GPU renderings have no shim and import the real TensorRT-LLM."""

from trtllm_forge.llmapi_cpu import LLM, STAND_IN, CompletionOutput, RequestOutput, SamplingParams

__version__ = "cpu-stand-in"
__all__ = ["LLM", "STAND_IN", "CompletionOutput", "RequestOutput", "SamplingParams"]
