"""Timing model: a Triton python-backend model that speaks the TRT-LLM ensemble's text contract and
streams tokens on a known schedule, so a benchmark client's measurements can be checked against truth.

Inputs (text contract): text_input, max_tokens, and optionally stream, min_tokens, end_id,
exclude_input_in_output, return_num_output_tokens. With the model config parameter `contract` = "tokens" it
speaks the tensorrt_llm model's contract instead: input_ids, input_lengths, request_output_len, streaming
→ output_ids (one token id per streamed response). Timing comes from the request parameters `ttft_ms` and `gap_ms` (defaults from
the model config parameters of the same names): the first token is sent `ttft_ms` after the request
arrives, token k at ttft_ms + k * gap_ms (an absolute schedule, so delays do not accumulate). gap_ms = 0
sends the tokens back to back ("flood").

Every response also carries `send_time_ns`: time.monotonic_ns() just before the response is handed to
Triton. On Linux this is the same CLOCK_MONOTONIC the client's time.perf_counter_ns() reads, so the
client can compare its receive stamp with the true send time.
"""

from __future__ import annotations

import heapq
import json
import threading
import time
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils


def _optional(request: Any, name: str, default: int) -> Any:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return default
    return tensor.as_numpy().reshape(-1)[0]


class _Stream:
    __slots__ = (
        "arrival_ns",
        "batched",
        "count_tokens",
        "first_ns",
        "first_token_ns",
        "gap_ns",
        "perf",
        "sender",
        "sent",
        "stream",
        "tokens",
        "total",
    )

    def __init__(
        self, sender: Any, total: int, first_ns: int, gap_ns: int, stream: bool, count_tokens: bool, batched: bool, tokens: bool
    ) -> None:
        self.sender = sender
        self.total = total
        self.sent = 0
        self.first_ns = first_ns
        self.gap_ns = gap_ns
        self.stream = stream
        self.count_tokens = count_tokens
        self.batched = batched
        self.tokens = tokens
        self.perf = False
        self.arrival_ns = 0
        self.first_token_ns = 0


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        self.default_ttft_ms = float(params.get("ttft_ms", "20"))
        self.default_gap_ms = float(params.get("gap_ms", "10"))
        self.batched = int(config.get("max_batch_size", 0)) > 0
        self.tokens = params.get("contract", "text") == "tokens"
        self.heap: list[tuple[int, int, _Stream]] = []  # (due time ns, arrival order, stream)
        self.seq = 0
        self.cond = threading.Condition()
        self.running = True
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def execute(self, requests: list[Any]) -> None:
        now = time.monotonic_ns()
        for request in requests:
            params = json.loads(request.parameters() or "{}")
            ttft_ms = float(params.get("ttft_ms", self.default_ttft_ms))
            gap_ms = float(params.get("gap_ms", self.default_gap_ms))
            if self.tokens:
                total = int(_optional(request, "request_output_len", 16))
                stream = bool(_optional(request, "streaming", True))
            else:
                total = int(_optional(request, "max_tokens", 16))
                stream = bool(_optional(request, "stream", True))
            count_tokens = bool(_optional(request, "return_num_output_tokens", False))
            state = _Stream(
                request.get_response_sender(),
                max(total, 0),
                now + int(ttft_ms * 1e6),
                int(gap_ms * 1e6),
                stream,
                count_tokens,
                self.batched,
                self.tokens,
            )
            state.perf = bool(_optional(request, "return_perf_metrics", False))
            state.arrival_ns = now
            due = state.first_ns if stream else state.first_ns + max(total - 1, 0) * state.gap_ns
            with self.cond:
                self.seq += 1
                heapq.heappush(self.heap, (due, self.seq, state))
                self.cond.notify()
        return None

    def _response(self, state: _Stream, n_tokens: int) -> Any:
        shape = (1, 1) if state.batched else (1,)
        if state.tokens:
            ids = np.full((1, 1, n_tokens) if state.batched else (1, n_tokens), 7, dtype=np.int32)
            outputs = [pb_utils.Tensor("output_ids", ids)]
        else:
            text = np.array([(" tok" * n_tokens).encode()], dtype=np.object_).reshape(shape)
            outputs = [pb_utils.Tensor("text_output", text)]
        if state.count_tokens:
            outputs.append(pb_utils.Tensor("num_output_tokens", np.array([n_tokens], dtype=np.int32).reshape(shape)))
        if state.perf:
            # Like TensorRT-LLM's return_perf_metrics (the schedule starts at arrival, so first_scheduled = arrival);
            # a token's time is when it was produced, before its response is put together.
            produced = time.monotonic_ns()
            state.first_token_ns = state.first_token_ns or produced
            for name, value in (
                ("arrival_time_ns", state.arrival_ns),
                ("first_scheduled_time_ns", state.arrival_ns),
                ("first_token_time_ns", state.first_token_ns),
                ("last_token_time_ns", produced),
            ):
                outputs.append(pb_utils.Tensor(name, np.array([value], dtype=np.int64).reshape(shape)))
        # Stamped after every other output is built: what follows the stamp is the same for every client that
        # asks for the same outputs (one tensor, the response object, Triton's response path).
        outputs.append(pb_utils.Tensor("send_time_ns", np.array([time.monotonic_ns()], dtype=np.int64).reshape(shape)))
        return pb_utils.InferenceResponse(output_tensors=outputs)

    def _emit(self, state: _Stream) -> int | None:
        """Send what is due for `state`; return the next due time, or None when the request is done."""
        if state.total == 0:
            state.sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return None
        if not state.stream:
            state.sender.send(self._response(state, state.total))
            state.sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return None
        state.sender.send(self._response(state, 1))
        state.sent += 1
        if state.sent >= state.total:
            state.sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return None
        return state.first_ns + state.sent * state.gap_ns

    def _loop(self) -> None:
        while True:
            with self.cond:
                while self.running and not self.heap:
                    self.cond.wait()
                if not self.running:
                    return
                due, seq, state = self.heap[0]
                wait_ns = due - time.monotonic_ns()
                if wait_ns > 0:
                    self.cond.wait(wait_ns / 1e9)
                    continue
                heapq.heappop(self.heap)
            try:
                next_due = self._emit(state)
            except Exception as exc:
                pb_utils.Logger.log_error(f"timing model: {exc}")
                next_due = None
            if next_due is not None:
                with self.cond:
                    heapq.heappush(self.heap, (next_due, seq, state))

    def finalize(self) -> None:
        with self.cond:
            self.running = False
            self.cond.notify()
        self.thread.join(timeout=5)
