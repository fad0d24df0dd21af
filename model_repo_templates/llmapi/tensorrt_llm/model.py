"""Triton python model serving TensorRT-LLM's PyTorch backend through the LLM API (TensorRT-LLM >= 1.0).

Written for trtllm-forge; behaves like NVIDIA's llmapi model (NVIDIA/TensorRT-LLM:triton_backend/all_models/llmapi/
tensorrt_llm/1/model.py and helpers.py): same tensors, `sampling_param_*` inputs passed to SamplingParams (with
NVIDIA's defaults: best_of 1, exclude_input_from_output false), `text_output` holding `output.text` of each
RequestOutput — in streaming mode the whole text so far, not a delta — finish/stop reasons as strings, `stop`
requests and client cancellation aborting the generation.

Runs inside the Triton python stub: imports numpy, yaml, triton_python_backend_utils, the stdlib, and
`tensorrt_llm` (at initialize, never at import). On GPU that is TensorRT-LLM; in trtllm-forge's CPU renderings a
`tensorrt_llm` shim beside this file resolves it to trtllm-forge's CPU stand-in. This file is the same in both.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils
import yaml

SAMPLING_INPUTS = (
    "best_of",
    "temperature",
    "top_k",
    "top_p",
    "frequency_penalty",
    "presence_penalty",
    "max_tokens",
    "seed",
    "exclude_input_from_output",
    "return_perf_metrics",
)
SAMPLING_DEFAULTS = {"best_of": 1, "exclude_input_from_output": False, "return_perf_metrics": False}
OUTPUT_FIELDS = {
    "return_finish_reason": "finish_reason",
    "return_stop_reason": "stop_reason",
    "return_cumulative_logprob": "cumulative_logprob",
}


def scalar(request: Any, name: str) -> Any:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return None
    array = tensor.as_numpy()
    if array.size != 1:
        raise pb_utils.TritonModelException(f"Expected a scalar tensor for tensor {name}")
    return array.item(0)


def _text(value: object) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        self.model_config = json.loads(args["model_config"])
        params = {k: v.get("string_value", "") for k, v in (self.model_config.get("parameters") or {}).items()}
        path = params.get("llm_config_path") or os.environ.get("LLM_CONFIG_PATH") or str(Path(__file__).with_name("model.yaml"))
        llm_args = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
        triton_config = llm_args.pop("triton_config", None) or {}
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(self.model_config)
        self.cancel_period_s = int(triton_config.get("cancellation_check_period_ms", 100)) / 1000.0
        from tensorrt_llm import LLM, SamplingParams  # lazy: TensorRT-LLM on GPU, the shim on CPU renderings

        self.SamplingParams = SamplingParams
        self.llm = LLM(**llm_args)
        self.in_flight: dict[int, tuple] = {}  # id(request) -> (triton request, RequestOutput, sender, user id)
        self.answered: set[int] = set()  # requests whose final response the cancellation loop sent
        self.lock = threading.Lock()
        self.running = True
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.cancel_thread = threading.Thread(target=self._cancellation_loop, daemon=True)
        self.cancel_thread.start()
        pb_utils.Logger.log_info(f"llmapi model: LLM({', '.join(sorted(llm_args))}) from {getattr(LLM, '__module__', '?')}")

    def execute(self, requests: list[Any]) -> list[Any] | None:
        if self.decoupled:
            for request in requests:
                asyncio.run_coroutine_threadsafe(self._serve(request, request.get_response_sender()), self.loop)
            return None
        collectors = [_Collector() for _ in requests]
        for request, collector in zip(requests, collectors, strict=False):
            asyncio.run_coroutine_threadsafe(self._serve(request, collector), self.loop)
        return [collector.wait() for collector in collectors]

    def _sampling(self, request: Any) -> dict[str, Any]:
        kwargs: dict[str, Any] = {}
        for name in SAMPLING_INPUTS:
            value = scalar(request, f"sampling_param_{name}")
            if value is None:
                value = SAMPLING_DEFAULTS.get(name)
            if value is not None:
                kwargs[name] = value
        stop = pb_utils.get_input_tensor_by_name(request, "sampling_param_stop")
        if stop is not None:
            kwargs["stop"] = [_text(s) for s in stop.as_numpy().reshape(-1)]
        return kwargs

    def _response(self, request_output: Any, request: Any) -> Any:
        outputs = request_output.outputs
        tensors = [pb_utils.Tensor("text_output", np.asarray([o.text.encode("utf-8") for o in outputs], dtype=np.object_))]
        for flag, name in OUTPUT_FIELDS.items():
            if not scalar(request, flag):
                continue
            values = [getattr(o, name) for o in outputs]
            if name == "cumulative_logprob":  # declared TYPE_FP32: a float, NaN when the engine did not compute it
                array = np.asarray([np.nan if v is None else float(v) for v in values], dtype=np.float32)
            else:
                array = np.asarray([str(v) for v in values], dtype=np.object_)
            tensors.append(pb_utils.Tensor(name, array))
        metrics = getattr(outputs[0], "request_perf_metrics", None)
        if metrics:  # sampling_param_return_perf_metrics: NVIDIA's per-request KV, timing and draft outputs
            tensors += self._perf_tensors(metrics)
        return pb_utils.InferenceResponse(output_tensors=tensors)

    @staticmethod
    def _perf_tensors(metrics: Any) -> list[Any]:
        kv, timing, spec = metrics.kv_cache_metrics, metrics.timing_metrics, metrics.speculative_decoding
        ns = lambda t: round(t.total_seconds() * 1e9) if hasattr(t, "total_seconds") else int(t)  # noqa: E731
        values = [
            ("kv_cache_reused_block", np.int32, kv.num_reused_blocks),
            ("kv_cache_missed_block", np.int32, kv.num_missed_blocks),
            ("kv_cache_alloc_new_blocks", np.int32, kv.num_new_allocated_blocks),
            ("kv_cache_alloc_total_blocks", np.int32, kv.num_total_allocated_blocks),
            ("kv_cache_hit_rate", np.float32, kv.kv_cache_hit_rate),
            ("arrival_time_ns", np.int64, ns(timing.arrival_time)),
            ("first_scheduled_time_ns", np.int64, ns(timing.first_scheduled_time)),
            ("first_token_time_ns", np.int64, ns(timing.first_token_time)),
            ("last_token_time_ns", np.int64, ns(timing.last_token_time)),
            ("acceptance_rate", np.float32, spec.acceptance_rate),
            ("total_accepted_draft_tokens", np.int32, spec.total_accepted_draft_tokens),
            ("total_draft_tokens", np.int32, spec.total_draft_tokens),
        ]
        return [pb_utils.Tensor(name, np.asarray([value], dtype=dtype)) for name, dtype, value in values]

    def _error(self, message: str) -> Any:
        return pb_utils.InferenceResponse(
            output_tensors=[pb_utils.Tensor("text_output", np.asarray(["N/A"], dtype=np.object_))], error=pb_utils.TritonError(message)
        )

    def _stop(self, user_id: str, sender: Any) -> None:
        if not user_id:
            sender.send(
                pb_utils.InferenceResponse(error=pb_utils.TritonError("A request id must be provided for request cancellation")),
                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
            )
            return
        with self.lock:
            for key, (_, output, _, uid) in list(self.in_flight.items()):
                if uid == user_id:
                    output.abort()
                    del self.in_flight[key]
        sender.send(
            pb_utils.InferenceResponse(error=pb_utils.TritonError("Request cancelled by client", pb_utils.TritonError.CANCELLED)),
            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
        )

    async def _serve(self, request: Any, sender: Any) -> None:
        if scalar(request, "stop"):
            self._stop(request.request_id(), sender)
            return
        key = id(request)
        try:
            text = pb_utils.get_input_tensor_by_name(request, "text_input")
            if text is None:
                raise pb_utils.TritonModelException("text_input is missing from the request")
            array = text.as_numpy()
            if array.ndim > 1:
                raise pb_utils.TritonModelException("The current implementation only supports text_input being a 1D tensor.")
            prompt = _text(array.reshape(-1)[0])
            streaming = bool(scalar(request, "streaming") or False)
            if streaming and not self.decoupled:
                raise pb_utils.TritonModelException("Streaming is only supported in decoupled mode.")
            output = self.llm.generate_async(prompt, self.SamplingParams(**self._sampling(request)), streaming=streaming)
            with self.lock:
                self.in_flight[key] = (request, output, sender, request.request_id())
            last = None
            async for last in output:
                if key in self.answered:
                    return  # the client went away; the cancellation loop answered
                if streaming:
                    if last.finished:
                        with self.lock:  # claimed before the final send: the cancellation loop no longer answers it
                            if key in self.answered:
                                return
                            self.in_flight.pop(key, None)
                    flags = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if last.finished else 0
                    sender.send(self._response(last, request), flags=flags)
            with self.lock:
                self.in_flight.pop(key, None)
            if key in self.answered:
                return
            if not streaming:  # also a request ended by a `stop` request: it gets what was generated
                sender.send(self._response(last, request), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            elif last is None or not last.finished:
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        except Exception as exc:
            with self.lock:
                self.in_flight.pop(key, None)
            pb_utils.Logger.log_error(f"llmapi model: error generating request: {exc}")
            sender.send(self._error(f"Error generating request: {exc}"), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        finally:
            self.answered.discard(key)

    def _cancellation_loop(self) -> None:
        while self.running:
            time.sleep(self.cancel_period_s)
            with self.lock:
                for key, (request, output, sender, _) in list(self.in_flight.items()):
                    if self.decoupled and request.is_cancelled():
                        output.abort()
                        del self.in_flight[key]
                        self.answered.add(key)
                        try:
                            sender.send(
                                pb_utils.InferenceResponse(
                                    error=pb_utils.TritonError("Request cancelled by client", pb_utils.TritonError.CANCELLED)
                                ),
                                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
                            )
                        except Exception as exc:
                            pb_utils.Logger.log_warn(f"llmapi model: cancelled request already answered: {exc}")

    def finalize(self) -> None:
        self.running = False
        self.loop.call_soon_threadsafe(self.loop.stop)
        shutdown = getattr(self.llm, "shutdown", None)
        if shutdown:
            shutdown()


class _Collector:
    """The response sender of a non-decoupled request: execute() waits for its one final response."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.response: Any = None

    def send(self, response: Any = None, flags: int = 0) -> None:
        if response is not None:
            self.response = response
        if flags & pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL:
            self.done.set()

    def wait(self) -> Any:
        self.done.wait()
        return self.response or pb_utils.InferenceResponse(error=pb_utils.TritonError("no response"))
