"""`RequestOutput` / `CompletionOutput` shaped like TensorRT-LLM's (NVIDIA/TensorRT-LLM:tensorrt_llm/executor/result.py,
tensorrt_llm/llmapi/llm.py): `outputs[i].text` is the whole text so far (streamed responses grow it), `text_diff` the
new part; `finish_reason` is 'stop' | 'length' | 'cancelled' (None while running); `stop_reason` the stop string or
token id that ended it."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any


@dataclass
class CompletionOutput:
    index: int = 0
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    cumulative_logprob: float | None = None
    logprobs: list[float] | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    request_perf_metrics: Any = None
    _last_text_len: int = 0
    _last_token_ids_len: int = 0

    @property
    def length(self) -> int:
        return len(self.token_ids)

    @property
    def text_diff(self) -> str:
        return self.text[self._last_text_len :]

    @property
    def token_ids_diff(self) -> list[int]:
        return self.token_ids[self._last_token_ids_len :]


# What the engine thread hands the caller's side: text, token ids, finish reason, stop reason, error, perf metrics.
_Snapshot = tuple[str, list[int], str | None, int | str | None, BaseException | None, Any]


class RequestOutput:
    """One request's result; iterate it (`async for`) for streamed updates, `await` it (or `.result()`) for the end."""

    def __init__(
        self, request_id: int, prompt: str | None, prompt_token_ids: list[int], streaming: bool, abort_fn: Callable[[int], None]
    ) -> None:
        self.request_id = request_id
        self.prompt = prompt
        self.prompt_token_ids = prompt_token_ids
        self.streaming = streaming
        self.outputs = [CompletionOutput()]
        self.finished = False
        self.error: BaseException | None = None
        self._abort_fn = abort_fn
        self._done = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: asyncio.Queue[_Snapshot] | None = None
        try:
            self._loop = asyncio.get_running_loop()
            self._queue = asyncio.Queue()
        except RuntimeError:
            pass

    # -- called from the engine thread -------------------------------------------------------------
    def _publish(
        self,
        text: str,
        token_ids: list[int],
        finish_reason: str | None,
        stop_reason: int | str | None,
        error: BaseException | None = None,
        perf_metrics: Any = None,
    ) -> None:
        snapshot = (text, list(token_ids), finish_reason, stop_reason, error, perf_metrics)
        if self._loop is not None and self._queue is not None:  # set together, in a running event loop
            self._loop.call_soon_threadsafe(self._queue.put_nowait, snapshot)
        else:
            self._apply(snapshot)
        if finish_reason is not None or error is not None:
            self._done.set()

    def _apply(self, snapshot: _Snapshot) -> None:
        text, token_ids, finish_reason, stop_reason, error, perf_metrics = snapshot
        out = self.outputs[0]
        out.request_perf_metrics = perf_metrics
        out._last_text_len, out._last_token_ids_len = len(out.text), len(out.token_ids)
        out.text, out.token_ids = text, token_ids
        out.finish_reason, out.stop_reason = finish_reason, stop_reason
        if error is not None:
            self.error = error
        self.finished = finish_reason is not None or error is not None

    # -- the caller's side ---------------------------------------------------------------------------
    def abort(self) -> None:
        """Stop generating for this request (the engine drops it at its next step)."""
        self._abort_fn(self.request_id)

    def __aiter__(self) -> RequestOutput:
        return self

    async def __anext__(self) -> RequestOutput:
        if self._queue is None:
            raise TypeError("generate_async was not called from a running event loop; use result()")
        while True:
            if self.finished:
                raise StopAsyncIteration
            self._apply(await self._queue.get())
            if self.error is not None:
                raise self.error
            if self.streaming or self.finished:
                return self

    async def aresult(self) -> RequestOutput:
        if self._queue is None:
            raise TypeError("generate_async was not called from a running event loop; use result()")
        while not self.finished:
            self._apply(await self._queue.get())
        if self.error is not None:
            raise self.error
        return self

    def __await__(self) -> Generator[Any, None, RequestOutput]:
        return self.aresult().__await__()

    def result(self, timeout: float | None = None) -> RequestOutput:
        if self._loop is not None:
            raise RuntimeError("this request belongs to an event loop; await it instead")
        if not self._done.wait(timeout):
            raise TimeoutError(f"request {self.request_id} did not finish within {timeout} s")
        if self.error is not None:
            raise self.error
        return self
