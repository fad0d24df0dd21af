"""Triton python model serving TensorRT-LLM's PyTorch backend through the LLM API (TensorRT-LLM >= 1.0).

Written for trtllm-forge; tensor names follow the llmapi model of TensorRT-LLM 1.2 so existing clients work.
Runs inside the Triton python stub: imports numpy, yaml, triton_python_backend_utils, the stdlib, and
tensorrt_llm (at initialize, never at import). Not exercised on this project's CPU machines: it needs a GPU.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils
import yaml

SAMPLING_INPUTS = {  # input tensor -> SamplingParams field
    "sampling_param_best_of": "best_of",
    "sampling_param_temperature": "temperature",
    "sampling_param_top_k": "top_k",
    "sampling_param_top_p": "top_p",
    "sampling_param_frequency_penalty": "frequency_penalty",
    "sampling_param_presence_penalty": "presence_penalty",
    "sampling_param_max_tokens": "max_tokens",
    "sampling_param_seed": "seed",
}


def scalar(request, name):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return None
    flat = tensor.as_numpy().reshape(-1)
    return flat[0].item() if flat.size else None


class TritonPythonModel:
    def initialize(self, args):
        model_config = json.loads(args["model_config"])
        params = {k: v.get("string_value", "") for k, v in (model_config.get("parameters") or {}).items()}
        path = params.get("llm_config_path") or os.environ.get("LLM_CONFIG_PATH") or str(Path(__file__).with_name("model.yaml"))
        llm_args = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
        llm_args.pop("triton_config", None)
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(model_config)
        from tensorrt_llm import LLM, SamplingParams  # lazy: only present in the serving image

        self.SamplingParams = SamplingParams
        self.llm = LLM(**llm_args)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def execute(self, requests):
        if self.decoupled:
            for request in requests:
                asyncio.run_coroutine_threadsafe(self._serve(request, request.get_response_sender()), self.loop)
            return None
        return [asyncio.run_coroutine_threadsafe(self._collect(request), self.loop).result() for request in requests]

    def _sampling(self, request):
        kwargs = {}
        for name, field in SAMPLING_INPUTS.items():
            value = scalar(request, name)
            if value is not None:
                kwargs[field] = value
        stop = pb_utils.get_input_tensor_by_name(request, "sampling_param_stop")
        if stop is not None:
            kwargs["stop"] = [s.decode("utf-8") if isinstance(s, bytes) else str(s) for s in stop.as_numpy().reshape(-1)]
        return self.SamplingParams(**kwargs)

    def _prompt(self, request) -> str:
        value = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy().reshape(-1)[0]
        return value.decode("utf-8") if isinstance(value, bytes) else str(value)

    def _response(self, text: str, output, request):
        tensors = [pb_utils.Tensor("text_output", np.array([text.encode("utf-8")], dtype=object))]
        if scalar(request, "return_finish_reason"):
            tensors.append(pb_utils.Tensor("finish_reason", np.array([str(output.finish_reason).encode()], dtype=object)))
        if scalar(request, "return_stop_reason"):
            tensors.append(pb_utils.Tensor("stop_reason", np.array([str(output.stop_reason).encode()], dtype=object)))
        if scalar(request, "return_cumulative_logprob"):
            tensors.append(pb_utils.Tensor("cumulative_logprob", np.array([output.cumulative_logprob or 0.0], dtype=np.float32)))
        return pb_utils.InferenceResponse(output_tensors=tensors)

    async def _collect(self, request):
        try:
            prompt = self._prompt(request)
            result = await self.llm.generate_async(prompt, self._sampling(request), streaming=False)
            output = result.outputs[0]
            text = output.text
            if scalar(request, "sampling_param_exclude_input_from_output") is False:
                text = prompt + text
            return self._response(text, output, request)
        except Exception as exc:  # noqa: BLE001
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc)))

    async def _serve(self, request, sender):
        try:
            if not scalar(request, "streaming"):
                sender.send(await self._collect(request), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                return
            sent = 0
            async for result in self.llm.generate_async(self._prompt(request), self._sampling(request), streaming=True):
                output = result.outputs[0]
                piece, sent = output.text[sent:], len(output.text)
                if piece:
                    sender.send(self._response(piece, output, request))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        except Exception as exc:  # noqa: BLE001
            sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc))),
                        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def finalize(self):
        self.loop.call_soon_threadsafe(self.loop.stop)
        shutdown = getattr(self.llm, "shutdown", None)
        if shutdown:
            shutdown()
