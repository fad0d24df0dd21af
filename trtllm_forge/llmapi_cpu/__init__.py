"""CPU STAND-IN for TensorRT-LLM's LLM API — this is NOT TensorRT-LLM.

TensorRT-LLM cannot be installed on machines without an NVIDIA GPU, so this package offers the part of
`tensorrt_llm`'s LLM API that trtllm-forge's llmapi Triton model (model_repo_templates/llmapi/tensorrt_llm/model.py)
and an OpenAI-style server use — `LLM(model=..., **llm_args)`, `generate_async(prompt, sampling_params, streaming=...)`,
`RequestOutput`/`CompletionOutput`, `SamplingParams`, `abort()`, `shutdown()` — backed by OpenVINO GenAI's
ContinuousBatchingPipeline on an OpenVINO IR directory that `trtllm-forge build-engine` writes.

Interface followed (names, defaults, finish/stop reasons), from NVIDIA's sources:
  NVIDIA/TensorRT-LLM:tensorrt_llm/sampling_params.py, tensorrt_llm/executor/result.py, tensorrt_llm/llmapi/llm.py,
  tensorrt_llm/llmapi/llm_args.py (argument names: trtllm_forge.llmapi_args).
The rendered CPU repository puts a `tensorrt_llm` shim package beside model.py so `from tensorrt_llm import LLM,
SamplingParams` resolves here; GPU renderings have no shim and import the real TensorRT-LLM.
"""

from trtllm_forge.llmapi_cpu.llm import LLM, RequestError
from trtllm_forge.llmapi_cpu.outputs import CompletionOutput, RequestOutput
from trtllm_forge.llmapi_cpu.sampling import SamplingParams

STAND_IN = True  # lets callers (and tests) tell the stand-in from the real tensorrt_llm

__all__ = ["LLM", "STAND_IN", "CompletionOutput", "RequestError", "RequestOutput", "SamplingParams"]
