"""What every target (an endpoint kind) offers the load generator."""

from __future__ import annotations

import asyncio
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from trtllm_forge.bench.records import RequestRecord
from trtllm_forge.bench.workload import BenchRequest

UNREACHABLE_END_ID = 1048576  # outside any vocabulary: generation runs to the requested length


@dataclass
class TargetInfo:
    kind: str
    url: str
    model: str
    forced_output_len: str | None = None  # how the output length is forced, or None
    output_tokens_source: str = "responses"
    notes: list[str] = field(default_factory=list)
    server_version: str | None = None


class TargetDown(Exception):
    """The endpoint cannot be reached any more: stop sending."""


class Target(ABC):
    kind = ""

    def __init__(self, url: str, model: str, tokenizer=None, force_output_len: bool = True, request_timeout: float = 600.0):
        self.url = url
        self.model = model
        self.tokenizer = tokenizer
        self.force_output_len = force_output_len
        self.request_timeout = request_timeout
        self.info = TargetInfo(self.kind, url, model)

    @abstractmethod
    async def open(self) -> None:
        """Connect and read what the endpoint accepts; raise StepError when it is not usable."""

    @abstractmethod
    async def send(self, request: BenchRequest, record: RequestRecord) -> None:
        """Send one request, fill `record` (sent_ns, responses, error); return when it has ended."""

    async def close(self) -> None:
        pass

    def count_client_tokens(self, records: list[RequestRecord]) -> None:
        """Turn kept response texts into token counts with the client tokenizer (after the run, off the hot path)."""
        if self.tokenizer is None:
            return
        for record in records:
            if record.texts is None:
                continue
            record.tokens = [len(self.tokenizer.encode(t, add_special_tokens=False)) if t else 0 for t in record.texts]
            record.output_tokens_source = "client_tokenizer"
            record.texts = None


def now_ns() -> int:
    return time.perf_counter_ns()


async def wait_done(done: asyncio.Future, record: RequestRecord, timeout: float) -> None:
    try:
        await asyncio.wait_for(done, timeout)
    except asyncio.TimeoutError:
        record.error_kind, record.error_message = "timeout", f"no final response within {timeout:g} s"
