"""What every target (an endpoint kind) offers the load generator."""

from __future__ import annotations

import asyncio
import itertools
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from trtllm_forge.bench.records import RequestRecord
from trtllm_forge.bench.workload import BenchRequest

UNREACHABLE_END_ID = 1048576  # outside any vocabulary: generation runs to the requested length


def output_length_plan(inputs: Iterable[str], force: bool, length_name: str = "max_tokens") -> tuple[str | None, bool, str | None]:
    """How to force the output length with the inputs a model declares: (min-length input, send an
    unreachable end_id, description). min_tokens (or min_length) = the requested length is enough on its
    own and is preferred; an out-of-vocabulary end_id is only the fallback, because an engine that indexes
    its logits by end_id while enforcing min_tokens writes out of bounds (seen: OpenVINO GenAI segfaults)."""
    if not force:
        return None, False, None
    length_input = next((n for n in ("min_tokens", "min_length") if n in inputs), None)
    if length_input:
        return length_input, False, f"{length_input}={length_name}"
    if "end_id" in inputs:
        return None, True, f"end_id={UNREACHABLE_END_ID} (unreachable)"
    return None, False, None


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

    def __init__(self, url: str, model: str, tokenizer: Any = None, force_output_len: bool = True, request_timeout: float = 600.0):
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

    async def close(self) -> None:  # noqa: B027 (an optional hook: most targets hold nothing to close)
        pass

    def count_client_tokens(self, records: list[RequestRecord]) -> None:
        """After the run, off the hot path: make server counts per-response, and turn kept response texts
        into token counts with the client tokenizer."""
        for record in records:
            if record.output_tokens_source == "server_count":
                cumulative_to_deltas(record)
        if self.tokenizer is None:
            return
        for record in records:
            if record.texts is None:
                continue
            record.tokens = [len(self.tokenizer.encode(t, add_special_tokens=False)) if t else 0 for t in record.texts]
            record.output_tokens_source = "client_tokenizer"
            record.texts = None


def cumulative_to_deltas(record: RequestRecord) -> None:
    """`num_output_tokens` may be a running total (1, 2, 3, ...; the CPU engine model sends it so) or a
    per-response count (1, 1, 1, ...). A strictly increasing series over several responses is taken as a
    running total and turned into per-response counts."""
    indexes = [i for i, n in enumerate(record.tokens) if n > 0]
    values = [record.tokens[i] for i in indexes]
    if len(values) > 1 and all(b > a for a, b in itertools.pairwise(values)):
        previous = 0
        for i, value in zip(indexes, values, strict=False):
            record.tokens[i] = value - previous
            previous = value
        record.output_tokens_source = "server_count_cumulative"


def now_ns() -> int:
    return time.perf_counter_ns()


async def wait_done(done: asyncio.Future, record: RequestRecord, timeout: float) -> None:
    try:
        await asyncio.wait_for(done, timeout)
    except TimeoutError:
        record.error_kind, record.error_message = "timeout", f"no final response within {timeout:g} s"
