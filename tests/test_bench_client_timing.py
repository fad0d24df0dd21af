"""How our gRPC bench client stamps (trtllm_forge/bench/target_grpc.py), against the real tritonserver serving the
timing model: properties of the stamps that hold however busy the machine is (no test here asserts punctuality;
the fidelity script measures that: scripts/bench_tools_fidelity.py).

- every stamp of a call is taken before any of its responses is decoded;
- a response flood is counted response by response (tokens, the model's send stamps, the empty final response);
- stamps are ordered and causal: our send stamp <= the model's arrival stamp <= its first send stamp, and each
  receive stamp >= the model's send stamp of the same response (one CLOCK_MONOTONIC on both sides);
- a lane carries one request at a time and is reused; a timed-out request's call is cancelled and its lane freed;
- the GIL switch interval the client lowers while open is restored on close.
"""

from __future__ import annotations

import asyncio
import sys
import time

import pytest

from trtllm_forge.bench import target_grpc
from trtllm_forge.bench.records import RequestRecord
from trtllm_forge.bench.target import now_ns
from trtllm_forge.bench.workload import BenchRequest

FLOOD_TOKENS = 256


@pytest.fixture(scope="module")
def timing_server(tmp_path_factory):
    from trtllm_forge.bench.local_triton import render_timing_model, start_triton

    root = tmp_path_factory.mktemp("client-timing")
    render_timing_model(root / "repo", "ensemble", ttft_ms=20.0, gap_ms=5.0)
    render_timing_model(root / "repo", "flood", ttft_ms=1.0, gap_ms=0.0)
    render_timing_model(root / "repo", "slow", ttft_ms=3_000.0, gap_ms=10.0)  # short: the server drains it before stopping
    server = start_triton(root / "repo", root)
    yield server
    server.stop()


def _request(output_tokens: int) -> BenchRequest:
    return BenchRequest(prompt="hello " * 8, input_ids=None, input_tokens=8, input_tokens_source="requested", output_tokens=output_tokens)


def _record(index: int, output_tokens: int) -> RequestRecord:
    return RequestRecord(
        id=f"m{index}",
        phase="measure",
        intended_ns=now_ns(),
        input_tokens=8,
        input_tokens_source="requested",
        requested_output_tokens=output_tokens,
    )


async def _send_all(target, n: int, output_tokens: int, concurrency: int) -> list[RequestRecord]:
    """Closed loop: `concurrency` senders, `n` requests."""
    records = [_record(i, output_tokens) for i in range(n)]
    pending = list(records)

    async def sender():
        while pending:
            record = pending.pop(0)
            await target.send(_request(output_tokens), record)

    await asyncio.gather(*(sender() for _ in range(concurrency)))
    return records


def _run(url: str, model: str, n: int, output_tokens: int, concurrency: int, request_timeout: float = 120.0, probe=None):
    """Open a target with one lane per request in flight, send, close; returns (records, target)."""

    async def main():
        target = target_grpc.TritonGrpcTarget(url, model, streams=concurrency, request_timeout=request_timeout)
        await target.open()
        try:
            records = await _send_all(target, n, output_tokens, concurrency)
            if probe is not None:
                await probe(target)
            return records, target
        finally:
            await target.close()

    return asyncio.run(main())


def test_every_stamp_of_a_call_is_taken_before_its_responses_are_decoded(timing_server, monkeypatch):
    decoded_at: dict[int, list[int]] = {}  # id(record) -> when each of its responses was decoded
    real_decode = target_grpc._Lane.decode

    def decode(self, record, raws):
        original = target_grpc._DECODE
        times = decoded_at.setdefault(id(record), [])

        def timed(raw):
            times.append(now_ns())
            return original(raw)

        target_grpc._DECODE = timed
        try:
            real_decode(self, record, raws)
        finally:
            target_grpc._DECODE = original

    monkeypatch.setattr(target_grpc._Lane, "decode", decode)
    records, _ = _run(timing_server.grpc_url, "ensemble", n=6, output_tokens=8, concurrency=2)
    for record in records:
        assert record.ok, record.error_message
        times = decoded_at[id(record)]
        assert len(times) == len(record.recv_ns) == 9  # 8 tokens and the empty final response
        assert max(record.recv_ns) < min(times), "a response was decoded before the call's last stamp was taken"


def test_a_response_flood_is_counted_response_by_response(timing_server):
    n, concurrency = 8, 4
    lanes = []

    async def probe(target):
        lanes.append(len(target.lanes))

    records, _ = _run(timing_server.grpc_url, "flood", n=n, output_tokens=FLOOD_TOKENS, concurrency=concurrency, probe=probe)
    assert all(r.ok for r in records), [r.error_message for r in records if not r.ok]
    for record in records:
        assert record.output_tokens == FLOOD_TOKENS
        assert len(record.recv_ns) == len(record.tokens) == len(record.final) == FLOOD_TOKENS + 1
        assert record.final == [False] * FLOOD_TOKENS + [True] and record.empty[-1] and not any(record.empty[:-1])
        assert len(record.server_send_ns) == FLOOD_TOKENS  # the model's stamp on every token-carrying response
    assert sum(len(r.recv_ns) for r in records) == n * (FLOOD_TOKENS + 1)
    assert lanes == [concurrency]  # one lane per request in flight, each reused: none added


def test_stamps_are_ordered_and_causal(timing_server):
    records, _ = _run(timing_server.grpc_url, "flood", n=6, output_tokens=64, concurrency=3)
    for record in records:
        assert record.ok, record.error_message
        assert record.recv_ns == sorted(record.recv_ns)
        assert all(a < b for a, b in zip(record.server_send_ns, record.server_send_ns[1:]))
        token_stamps = [t for t, k in zip(record.recv_ns, record.tokens) if k > 0]
        assert all(recv >= sent for recv, sent in zip(token_stamps, record.server_send_ns)), "a response stamped before the model sent it"
        arrival = (record.server_perf or {}).get("arrival_time_ns")
        assert arrival is not None, "the timing model returns its arrival stamp when asked (return_perf_metrics)"
        assert record.sent_ns <= arrival <= record.server_send_ns[0] <= token_stamps[0]


def test_a_timed_out_call_is_cancelled_and_its_lane_freed(timing_server):
    async def probe(target):
        deadline = time.monotonic() + 30
        while len(target.free) < len(target.lanes) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        # the second request may get a new lane while the first lane's cancelled call winds down
        assert len(target.free) == len(target.lanes) <= 2
        assert all(lane.running is None and lane.current is None for lane in target.lanes)

    records, _ = _run(timing_server.grpc_url, "slow", n=2, output_tokens=4, concurrency=1, request_timeout=0.5, probe=probe)
    assert [r.error_kind for r in records] == ["timeout", "timeout"]
    assert all(r.sent_ns > 0 and not r.tokens for r in records)


def test_the_gil_switch_interval_is_lowered_while_open_and_restored(timing_server):
    before = sys.getswitchinterval()
    seen = []

    async def probe(target):
        seen.append(sys.getswitchinterval())

    _run(timing_server.grpc_url, "ensemble", n=1, output_tokens=2, concurrency=1, probe=probe)
    assert seen == [pytest.approx(min(before, target_grpc.GIL_SWITCH_S))]
    assert sys.getswitchinterval() == before
