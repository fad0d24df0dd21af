"""How our gRPC bench client stamps (trtllm_forge/bench/target_grpc.py), against the real tritonserver serving the
timing model: properties of the stamps that hold however busy the machine is (no test here asserts punctuality;
the fidelity script measures that: scripts/bench_tools_fidelity.py).

- each response is read as it comes (right after its stamp), so a request ends with its final response;
- a response flood is counted response by response (tokens, the model's send stamps, the empty final response);
- stamps are ordered and causal: our send stamp <= the model's arrival stamp <= its first send stamp, and each
  receive stamp >= the model's send stamp of the same response (one CLOCK_MONOTONIC on both sides);
- outputs are read by position only where their names are there (a response that orders them otherwise is read
  by name), and the model's perf stamps are its first-token and last responses';
- a lane keeps one stream open and carries request after request on it; several requests on one stream get
  their own responses (matched by id) however the responses interleave, and a server error ends only its request;
- a timed-out request is dropped from its stream (the stream is cancelled when nothing else is on it, and
  reopened for the next request); its late responses go to no other request;
- receive stamps are the kernel's (a response that arrived while another thread held the GIL is stamped when it
  arrived); every lane has a connection of its own; a request larger than the server's flow-control window is sent;
- close() leaves no client thread behind; the process's GIL switch interval is left as it is.
"""

from __future__ import annotations

import asyncio
import itertools
import sys
import threading
from pathlib import Path

import pytest

from trtllm_forge.bench import target_grpc
from trtllm_forge.bench.records import RequestRecord
from trtllm_forge.bench.target import now_ns
from trtllm_forge.bench.workload import BenchRequest

FLOOD_TOKENS = 256


SHUFFLED_TTFT_NS = 1_000_000  # the `shuffled` timing model's TTFT


@pytest.fixture(scope="module")
def timing_server(tmp_path_factory):
    from bench_support.local_triton import render_timing_model, start_triton

    root = tmp_path_factory.mktemp("client-timing")
    render_timing_model(root / "repo", "ensemble", ttft_ms=20.0, gap_ms=5.0)
    render_timing_model(root / "repo", "flood", ttft_ms=1.0, gap_ms=0.0)
    render_timing_model(root / "repo", "slow", ttft_ms=3_000.0, gap_ms=10.0)  # short: the server drains it before stopping
    # The timing model with its outputs in reverse order in every other response (same count, other places)
    shuffled = render_timing_model(root / "repo", "shuffled", ttft_ms=SHUFFLED_TTFT_NS / 1e6, gap_ms=0.0) / "1" / "model.py"
    code = shuffled.read_text()
    assert "return pb_utils.InferenceResponse(output_tensors=outputs)" in code
    shuffled.write_text(
        code.replace(
            "return pb_utils.InferenceResponse(output_tensors=outputs)",
            "return pb_utils.InferenceResponse(output_tensors=outputs[::-1] if state.sent % 2 else outputs)",
        )
    )
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


def _lane_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "bench-grpc-lane"]


def test_each_response_is_read_as_it_comes_not_after_the_final_one(timing_server, monkeypatch):
    """A request's end reaches the loop right after its final response: no pass over its earlier responses then
    (reading a flood request's 257 responses only after the final one delayed the next request by ~2 ms)."""
    stamps_when_read: dict[str, list[int]] = {}  # record id -> how many stamps it had when each response was read
    real_parse = target_grpc.TritonGrpcTarget.parse_response

    def parse_response(self, response, record):
        stamps_when_read.setdefault(record.id, []).append(len(record.recv_ns))
        return real_parse(self, response, record)

    monkeypatch.setattr(target_grpc.TritonGrpcTarget, "parse_response", parse_response)
    records, _ = _run(timing_server.grpc_url, "flood", n=6, output_tokens=64, concurrency=2)
    for record in records:
        assert record.ok, record.error_message
        assert len(record.recv_ns) == 65  # 64 tokens and the empty final response
        assert stamps_when_read[record.id] == list(range(1, 66)), "a response was read after a later one was stamped"


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
        assert all(a < b for a, b in zip(record.server_send_ns, record.server_send_ns[1:], strict=False))
        token_stamps = [t for t, k in zip(record.recv_ns, record.tokens, strict=False) if k > 0]
        assert all(recv >= sent for recv, sent in zip(token_stamps, record.server_send_ns, strict=False)), (
            "a response stamped before the model sent it"
        )
        arrival = (record.server_perf or {}).get("arrival_time_ns")
        assert arrival is not None, "the timing model returns its arrival stamp when asked (return_perf_metrics)"
        assert record.sent_ns <= arrival <= record.server_send_ns[0] <= token_stamps[0]


def test_outputs_in_another_order_are_read_by_name_and_perf_stamps_per_request(timing_server):
    n_tokens = 9
    records, target = _run(timing_server.grpc_url, "shuffled", n=4, output_tokens=n_tokens, concurrency=2)
    for record in records:
        assert record.ok, record.error_message
        assert record.tokens == [1] * n_tokens + [0]
        assert len(record.server_send_ns) == n_tokens
        # a send stamp read from another output (arrival, first token) would repeat instead of increasing
        assert all(a < b for a, b in zip(record.server_send_ns, record.server_send_ns[1:], strict=False))
        perf = record.server_perf or {}
        # a token's time is taken as it is produced, before its response's send stamp: the first token no earlier than
        # the model's TTFT (1 ms) after arrival (so it is not the arrival stamp, read from the wrong output), the last
        # after the previous response's send stamp. Order only: a busy machine delays the sends, never reorders them.
        assert perf["arrival_time_ns"] + SHUFFLED_TTFT_NS <= perf["first_token_time_ns"] <= record.server_send_ns[0]
        assert record.server_send_ns[-2] < perf["last_token_time_ns"] <= record.server_send_ns[-1]
        assert record.sent_ns <= perf["arrival_time_ns"] == perf["first_scheduled_time_ns"] <= record.server_send_ns[0]
    assert sorted(target.layouts) == [0, 7]  # the empty final response, and the model's 7 outputs in one of two orders


def _send_mixed(url: str, model: str, plan: list[tuple[int, float | None, float]], request_timeout: float = 120.0, after=None):
    """The requests of `plan` on ONE lane (one stream): (output tokens, the model's TTFT in ms or None for its
    default, seconds to wait before sending) per request; `after(target)` then runs before close. Returns the records."""

    async def main():
        target = target_grpc.TritonGrpcTarget(url, model, streams=1, request_timeout=request_timeout)
        await target.open()
        real_build = target.build

        def build(request, request_id):
            message = real_build(request, request_id)
            ttft_ms = ttfts.get(request_id)
            if ttft_ms is not None:
                message.parameters["ttft_ms"].double_param = ttft_ms
            return message

        target.build = build  # type: ignore[method-assign]
        ttfts = {f"m{i}": ttft for i, (_, ttft, _) in enumerate(plan)}
        records = [_record(i, tokens) for i, (tokens, _, _) in enumerate(plan)]

        async def send(record, delay):
            await asyncio.sleep(delay)
            await target.send(_request(record.requested_output_tokens), record)

        try:
            await asyncio.gather(*(send(r, delay) for r, (_, _, delay) in zip(records, plan, strict=False)))
            assert len(target.lanes) == 1
            if after is not None:
                await after(target)
            return records
        finally:
            await target.close()

    return asyncio.run(main())


def test_requests_sharing_a_stream_get_their_own_responses_however_they_interleave(timing_server):
    plan = [(4 + 3 * i, None, 0.0) for i in range(5)]  # different lengths: a response routed to the wrong request shows
    records = _send_mixed(timing_server.grpc_url, "ensemble", plan)
    for record, (tokens, _, _) in zip(records, plan, strict=False):
        assert record.ok, record.error_message
        assert record.output_tokens == tokens and len(record.server_send_ns) == tokens
        assert record.final == [False] * tokens + [True]
        assert record.recv_ns == sorted(record.recv_ns)
    arrivals = sorted((stamp, record.id) for record in records for stamp in record.recv_ns)
    switches = sum(1 for (_, a), (_, b) in itertools.pairwise(arrivals) if a != b)
    assert switches > len(records) - 1, "the requests' responses did not interleave on the stream"
    assert not _lane_threads(), "close() left a lane thread running"


def test_a_server_error_ends_only_its_request_on_a_shared_stream(timing_server, monkeypatch):
    real = target_grpc.TritonGrpcTarget.request_inputs

    def request_inputs(self, request):  # the 3-token request sends INT64 where the model takes INT32
        spec = real(self, request)
        return [(n, "INT64" if d == "INT32" and request.output_tokens == 3 else d, v) for n, d, v in spec]

    monkeypatch.setattr(target_grpc.TritonGrpcTarget, "request_inputs", request_inputs)
    records = _send_mixed(timing_server.grpc_url, "ensemble", [(4, None, 0.0), (3, None, 0.0), (5, None, 0.0)])
    assert [r.ok for r in records] == [True, False, True]
    assert (
        records[1].error_kind == "server_error" and "m1" in (records[1].error_message or "") and "INT64" in (records[1].error_message or "")
    )
    assert not records[1].recv_ns and records[1].output_tokens == 0
    assert [r.output_tokens for r in records] == [4, 0, 5]


def test_a_timed_out_request_is_dropped_and_its_late_responses_reach_no_other(timing_server):
    """On one stream: a slow request (first token after 5 s) times out at 2 s while a second one, sent at 1 s with
    its first token at 2.5 s, is in flight, so the stream stays open; the slow request's responses come at 5 s
    and are dropped; a request sent after them gets exactly its own responses."""
    later: list = []

    async def after(target):
        await asyncio.sleep(3.0)  # until the slow request's responses have come and gone
        (lane,) = target.lanes
        assert not lane.pending and lane.open and not lane.cancelled
        record = _record(9, 3)
        await target.send(_request(3), record)
        later.append(record)

    slow, other = _send_mixed(timing_server.grpc_url, "ensemble", [(4, 5_000.0, 0.0), (4, 1_500.0, 1.0)], request_timeout=2.0, after=after)
    assert slow.error_kind == "timeout" and not slow.tokens and not slow.recv_ns and slow.sent_ns > 0
    assert other.ok, other.error_message
    assert other.output_tokens == 4 and len(other.recv_ns) == 5
    (record,) = later
    assert record.ok, record.error_message
    assert record.output_tokens == 3 and record.final == [False, False, False, True]
    assert not _lane_threads()


def test_a_timed_out_request_alone_on_its_stream_cancels_it_and_the_next_opens_a_new_one(timing_server):
    async def probe(target):
        (lane,) = target.lanes
        assert not lane.pending

    records, _ = _run(timing_server.grpc_url, "slow", n=2, output_tokens=4, concurrency=1, request_timeout=0.5, probe=probe)
    assert [r.error_kind for r in records] == ["timeout", "timeout"]
    assert all(r.sent_ns > 0 and not r.tokens for r in records)
    assert not _lane_threads()


def test_after_the_server_restarts_a_lane_connects_again(tmp_path):
    """Triton stopped under an open target: the lane sees its connection close, and the next request finds the
    server down (TargetDown: the runner stops sending); with Triton started again on the same ports, the lane opens
    a new connection once the server answers and the request after that succeeds."""
    from bench_support.local_triton import render_timing_model, start_triton

    from trtllm_forge.bench.target import TargetDown

    render_timing_model(tmp_path / "repo", "ensemble", ttft_ms=20.0, gap_ms=5.0)
    (tmp_path / "first").mkdir()
    (tmp_path / "second").mkdir()
    server = start_triton(tmp_path / "repo", tmp_path / "first")
    outcomes: list = []

    async def main():
        nonlocal server
        target = target_grpc.TritonGrpcTarget(server.grpc_url, "ensemble", streams=1, request_timeout=30)
        await target.open()
        try:
            first = _record(0, 3)
            await target.send(_request(3), first)
            outcomes.append(first.error_kind)
            server.stop()
            (lane,) = target.lanes
            for _ in range(1000):  # the reader sees the connection close (bounded: 10 s)
                if lane.broken is not None:
                    break
                await asyncio.sleep(0.01)
            assert lane.broken is not None and lane.broken[0] == "connection"
            down = _record(1, 3)
            try:
                await target.send(_request(3), down)
            except TargetDown:
                outcomes.append("target down")
            outcomes.append(down.error_kind)
            server = start_triton(tmp_path / "repo", tmp_path / "second", ports=server.ports)
            again = _record(2, 3)
            await target.send(_request(3), again)
            outcomes.append((again.error_kind, again.output_tokens))
        finally:
            await target.close()

    try:
        asyncio.run(main())
    finally:
        server.stop()
    assert outcomes == [None, "target down", "connection", (None, 3)]
    assert not _lane_threads()


def test_the_process_gil_switch_interval_is_left_as_it_is(timing_server):
    """The client changes no process-wide setting (it lowered the GIL switch interval while its reader stamped)."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(0.003)  # not Python's default: a client restoring "the default" would show
    try:
        seen = []

        async def probe(target):
            seen.append(sys.getswitchinterval())

        _run(timing_server.grpc_url, "ensemble", n=1, output_tokens=2, concurrency=1, probe=probe)
        assert seen == [pytest.approx(0.003)] and sys.getswitchinterval() == pytest.approx(0.003)
    finally:
        sys.setswitchinterval(before)


def test_a_response_that_cannot_be_read_ends_only_its_request(timing_server, monkeypatch):
    real = target_grpc.TritonGrpcTarget.parse_response

    def parse_response(self, response, record):
        if record.id == "m1":
            raise ValueError("garbled")
        return real(self, response, record)

    monkeypatch.setattr(target_grpc.TritonGrpcTarget, "parse_response", parse_response)
    records = _send_mixed(timing_server.grpc_url, "ensemble", [(4, None, 0.0), (3, None, 0.0), (5, None, 0.0)])
    assert [r.error_kind for r in records] == [None, "client_error", None]
    assert "garbled" in (records[1].error_message or "")
    assert [r.output_tokens for r in records] == [4, 0, 5]
    assert not _lane_threads()


def _established_to(port: int) -> int:
    """Established TCP connections on this host whose remote end is `port` (the client side of each)."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == "01" and int(fields[2].rsplit(":", 1)[1], 16) == port:
                count += 1
    return count


def test_every_lane_has_a_connection_of_its_own(timing_server):
    """A lane's stream is read by its own connection's thread (its receive stamps are that socket's): 4 lanes open 4
    connections, and grpcio's channel for the unary calls (model config, metadata) one more."""
    port = timing_server.ports["grpc"]
    before = _established_to(port)
    seen = []

    async def probe(target):
        seen.append((len(target.lanes), _established_to(port) - before))

    records, _ = _run(timing_server.grpc_url, "ensemble", n=8, output_tokens=4, concurrency=4, probe=probe)
    assert all(r.error_kind is None and r.output_tokens == 4 for r in records)
    assert seen == [(4, 4 + 1)]


def test_receive_stamps_are_the_kernels_not_the_reader_threads(timing_server):
    """Responses that reach the socket while another thread holds the GIL are stamped when they arrived (the kernel's
    receive stamp), not when the reader thread got the GIL back: the reader cannot run a line of Python meanwhile."""

    async def main():
        target = target_grpc.TritonGrpcTarget(timing_server.grpc_url, "ensemble", streams=1)
        await target.open()
        try:
            record = _record(0, 8)
            sending = asyncio.create_task(target.send(_request(8), record))
            while not record.sent_ns:
                await asyncio.sleep(0)
            switch_interval = sys.getswitchinterval()
            sys.setswitchinterval(5.0)  # no other thread is given the GIL while this one spins
            try:
                start = now_ns()
                while now_ns() - start < 400_000_000:  # the model's 8 responses are due 20-55 ms after the send
                    pass
                released = now_ns()
            finally:
                sys.setswitchinterval(switch_interval)
            await sending
            return record, released
        finally:
            await target.close()

    record, released = asyncio.run(main())
    assert record.ok, record.error_message
    token_stamps = [t for t, k in zip(record.recv_ns, record.tokens, strict=False) if k > 0]
    assert len(token_stamps) == 8
    assert all(recv >= sent for recv, sent in zip(token_stamps, record.server_send_ns, strict=False)), (
        "a response stamped before the model sent it"
    )
    assert any(stamp < released for stamp in token_stamps), "every response was stamped after the GIL came back: not the kernel's stamp"


def test_a_request_larger_than_the_servers_flow_control_window_is_sent_in_parts(timing_server):
    """HTTP/2 flow control: a 1.5 MB request (the server's window starts at 64 KB) goes out as the server's
    WINDOW_UPDATEs allow, and is answered."""

    async def main():
        target = target_grpc.TritonGrpcTarget(timing_server.grpc_url, "ensemble", streams=1)
        await target.open()
        try:
            record = _record(0, 3)
            request = BenchRequest(
                prompt="hello " * 250_000, input_ids=None, input_tokens=250_000, input_tokens_source="requested", output_tokens=3
            )
            await target.send(request, record)
            follow = _record(1, 2)
            await target.send(_request(2), follow)  # the stream carries on after it
            return record, follow
        finally:
            await target.close()

    record, follow = asyncio.run(main())
    assert record.ok and follow.ok, (record.error_message, follow.error_message)
    assert record.output_tokens == 3 and follow.output_tokens == 2


def test_the_server_we_start_runs_in_the_users_grpc_environment(timing_server):
    """Our grpc defaults are for our own client: tritonserver's gRPC server gets the environment the user gave us."""
    import trtllm_forge

    raw = Path(f"/proc/{timing_server.process.pid}/environ").read_bytes().decode()
    environ = dict(item.split("=", 1) for item in raw.split("\0") if "=" in item)
    if not trtllm_forge._DEFAULTED:
        pytest.skip("every grpc default was set before trtllm_forge was imported: nothing of ours to leave out")
    for name in trtllm_forge._DEFAULTED:
        assert environ.get(name) != trtllm_forge.GRPC_DEFAULTS[name], name


def test_a_target_that_cannot_open_leaves_nothing_open(timing_server):
    """open() failing (a model the server does not have) closes what it opened: no grpcio channel, no lane or reader
    thread."""
    from trtllm_forge.errors import StepError

    async def main():
        target = target_grpc.TritonGrpcTarget(timing_server.grpc_url, "missing-model", streams=2)
        with pytest.raises(StepError, match="cannot read model 'missing-model'"):
            await target.open()
        return target

    target = asyncio.run(main())
    assert target.channel is None and not target.lanes and not _lane_threads()


@pytest.mark.parametrize("kernel_stamps", [True, False])
def test_the_target_says_whose_receive_stamps_it_records(timing_server, monkeypatch, kernel_stamps):
    """The summary's target notes name the stamps' source: the kernel's, or (a platform without SO_TIMESTAMPNS) the
    reader threads'."""
    from trtllm_forge.bench import grpc_wire

    if not kernel_stamps:
        monkeypatch.setattr(grpc_wire, "SO_TIMESTAMPNS", None)
    records, target = _run(timing_server.grpc_url, "ensemble", n=2, output_tokens=2, concurrency=2)
    assert all(r.ok for r in records)
    notes = " ".join(target.info.notes)
    assert ("receive stamps from the kernel" in notes) == kernel_stamps
    assert ("receive stamps taken by the client's reader threads" in notes) == (not kernel_stamps)
