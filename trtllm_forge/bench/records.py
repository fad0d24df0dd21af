"""The per-request record: everything measured about one request, written one JSON line per request so
every metric can be recomputed later. Times are `time.perf_counter_ns()` (CLOCK_MONOTONIC on Linux)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO


@dataclass(slots=True)
class RequestRecord:
    id: str
    phase: str  # "warmup" or "measure"
    intended_ns: int  # when the schedule wanted it sent
    input_tokens: int
    input_tokens_source: str  # "client_tokenizer", "dataset_ids", "requested"
    requested_output_tokens: int
    sent_ns: int = 0
    # One entry per response, in arrival order: receive time, tokens it carried, empty, final flag.
    recv_ns: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    empty: list[bool] = field(default_factory=list)
    final: list[bool] = field(default_factory=list)
    server_send_ns: list[int] = field(default_factory=list)  # the server's own send stamps, when it gives them
    texts: list[str] | None = None  # response texts kept only until tokens are counted on the client
    output_tokens_source: str = "responses"  # "server_count", "server_ids", "client_tokenizer", "responses"
    server_perf: dict | None = None  # TensorRT-LLM return_perf_metrics: arrival/first_scheduled/first_token/last_token_time_ns
    usage_tokens: int | None = None  # an OpenAI server's usage.completion_tokens
    error_kind: str | None = None
    error_message: str | None = None
    worker: int = 0
    retries: int = 0  # resends after the connection failed before any response (OpenAI target)

    @property
    def ok(self) -> bool:
        return self.error_kind is None

    @property
    def output_tokens(self) -> int:
        return sum(self.tokens)

    def add_response(self, stamp: int, tokens: int, text: str | None = None, final: bool = False, server_ns: int | None = None) -> None:
        """Record one response as it arrived: receive stamp, token count, empty/final flags, server stamp."""
        self.recv_ns.append(stamp)
        self.add_content(tokens, text, final, server_ns)

    def add_content(self, tokens: int, text: str | None = None, final: bool = False, server_ns: int | None = None) -> None:
        """What the next response carried, when its receive stamp is already in `recv_ns` (a client that
        stamps responses as they come and decodes them later)."""
        self.tokens.append(tokens)
        self.empty.append(tokens == 0)
        self.final.append(final)
        if server_ns is not None:
            self.server_send_ns.append(server_ns)
        if self.texts is not None:
            self.texts.append(text or "")

    def to_dict(self) -> dict:
        return {
            "id": self.id,
            "phase": self.phase,
            "worker": self.worker,
            "intended_ns": self.intended_ns,
            "sent_ns": self.sent_ns,
            "responses": [
                {"recv_ns": r, "tokens": t, "empty": e, "final": f}
                for r, t, e, f in zip(self.recv_ns, self.tokens, self.empty, self.final, strict=False)
            ],
            "server_send_ns": self.server_send_ns or None,
            "input_tokens": self.input_tokens,
            "input_tokens_source": self.input_tokens_source,
            "requested_output_tokens": self.requested_output_tokens,
            "output_tokens": self.output_tokens,
            "output_tokens_source": self.output_tokens_source,
            "usage_output_tokens": self.usage_tokens,
            "server_perf": self.server_perf,
            "error": None if self.ok else {"kind": self.error_kind, "message": self.error_message},
            "retries": self.retries,
        }

    @classmethod
    def from_dict(cls, data: dict) -> RequestRecord:
        responses = data.get("responses") or []
        error = data.get("error") or {}
        return cls(
            id=data["id"],
            phase=data["phase"],
            intended_ns=data["intended_ns"],
            input_tokens=data["input_tokens"],
            input_tokens_source=data["input_tokens_source"],
            requested_output_tokens=data["requested_output_tokens"],
            sent_ns=data["sent_ns"],
            recv_ns=[r["recv_ns"] for r in responses],
            tokens=[r["tokens"] for r in responses],
            empty=[r["empty"] for r in responses],
            final=[r["final"] for r in responses],
            server_send_ns=data.get("server_send_ns") or [],
            output_tokens_source=data["output_tokens_source"],
            usage_tokens=data.get("usage_output_tokens"),
            server_perf=data.get("server_perf"),
            error_kind=error.get("kind"),
            error_message=error.get("message"),
            worker=data.get("worker", 0),
            retries=data.get("retries", 0),
        )


def write_jsonl(records: list[RequestRecord], out: IO[str]) -> None:
    for record in records:
        out.write(json.dumps(record.to_dict(), separators=(",", ":")) + "\n")


def read_jsonl(path: Path) -> list[RequestRecord]:
    with open(path) as handle:
        return [RequestRecord.from_dict(json.loads(line)) for line in handle if line.strip()]
