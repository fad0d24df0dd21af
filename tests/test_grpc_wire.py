"""The bench's own HTTP/2 gRPC streams (trtllm_forge/bench/grpc_wire.py) against another implementation of gRPC:
grpcio's server (grpc's C core), serving the method the bench calls with raw bytes. Triton's own server is met in
tests/test_bench_client_timing.py; here the server does what Triton rarely does on demand: ends a stream with an
error status and a message that needs percent-encoding, sends messages larger than a frame and than the initial
flow-control window, and shuts down under open streams."""

from __future__ import annotations

import contextlib
import threading
from concurrent import futures

import grpc
import pytest

from trtllm_forge.bench.grpc_wire import WireConnection

METHOD = b"/inference.GRPCInferenceService/ModelStreamInfer"
STATUS_TEXT = "no room: 100% full, ünïcode ✓"


def _handler(requests, context):
    """Each request is a command: b"echo:<n>" answers n copies of the request, b"fail" ends the stream with
    RESOURCE_EXHAUSTED, b"big" answers 1.5 MB, b"hold" waits until the server stops."""
    for request in requests:
        if request.startswith(b"echo:"):
            for _ in range(int(request[5:])):
                yield request
        elif request == b"fail":
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, STATUS_TEXT)
        elif request == b"big":
            yield bytes(range(256)) * 6144
        elif request == b"hold":
            held.set()
            while context.is_active():
                context_done.wait(0.05)
        else:
            yield b"size:%d" % len(request)


held = threading.Event()
context_done = threading.Event()


@pytest.fixture
def server():
    service = grpc.method_handlers_generic_handler(
        "inference.GRPCInferenceService",
        {"ModelStreamInfer": grpc.stream_stream_rpc_method_handler(_handler)},
    )
    # grpc's defaults would take 4 MB before the first WINDOW_UPDATE, in frames of up to 4 MB: 64 KB windows (no BDP
    # probing) and 16 KB frames make every message here past 64 KB wait for the server's window
    options = [("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", 65536), ("grpc.http2.max_frame_size", 16384)]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), handlers=(service,), options=options)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    held.clear()
    context_done.clear()
    yield server, f"127.0.0.1:{port}"
    server.stop(0)


class Stream:
    """One stream's callbacks, recorded."""

    def __init__(self, connection: WireConnection):
        self.messages: list[tuple[int, bytes]] = []
        self.status: list = []
        self.ended = threading.Event()
        self.connection = connection
        self.stream = connection.open_stream(METHOD, self._message, self._end)

    def _message(self, stamp: int, raw: bytes) -> None:
        self.messages.append((stamp, raw))

    def _end(self, status) -> None:
        self.status.append(status)
        self.ended.set()

    def send(self, message: bytes) -> None:
        assert self.connection.send_message(self.stream, message)


@contextlib.contextmanager
def _connected(address: str):
    """A connection and its reader; closed after, its reader gone."""
    connection = WireConnection(address)
    reader = threading.Thread(target=connection.serve, daemon=True)
    reader.start()
    try:
        assert connection.settled.wait(10)
        yield connection, reader
    finally:
        context_done.set()
        connection.shutdown()
        reader.join(10)
        assert not reader.is_alive()


def test_messages_come_stamped_in_order_and_an_error_status_keeps_its_message(server):
    _, address = server
    with _connected(address) as (connection, _reader):
        stream = Stream(connection)
        stream.send(b"echo:3")
        stream.send(b"fail")
        assert stream.ended.wait(10)
        assert [raw for _, raw in stream.messages] == [b"echo:3"] * 3
        stamps = [stamp for stamp, _ in stream.messages]
        assert stamps == sorted(stamps) and all(stamps), stamps
        assert stream.status == [("grpc_resource_exhausted", STATUS_TEXT)], stream.status  # percent-decoded, UTF-8
        assert connection.client_stamped_reads == 0, "a read came without the kernel's stamp"
        assert connection.kernel_stamps
        second = Stream(connection)  # the connection carries on with a new stream
        second.send(b"echo:1")
        connection.half_close(second.stream)
        assert second.ended.wait(10)
        assert [raw for _, raw in second.messages] == [b"echo:1"] and second.status == [None]


def test_messages_larger_than_a_frame_and_the_window_go_both_ways(server):
    _, address = server
    with _connected(address) as (connection, _reader):
        stream = Stream(connection)
        request = b"x" * (3 << 20)  # 3 MB out twice: past the server's 64 KB window, in 16 KB frames
        stream.send(request)
        stream.send(request)
        stream.send(b"big")
        stream.send(b"echo:2")
        connection.half_close(stream.stream)  # END_STREAM must wait until the queued messages are out
        assert stream.ended.wait(30)
        assert stream.status == [None]
        assert connection.window_waits > 0
        raws = [raw for _, raw in stream.messages]
        assert raws[:2] == [b"size:%d" % len(request)] * 2
        assert raws[2] == bytes(range(256)) * 6144  # 1.5 MB in: reassembled from many frames
        assert raws[3:] == [b"echo:2", b"echo:2"]


def test_a_server_stopping_under_an_open_stream_ends_it_with_an_error(server):
    grpc_server, address = server
    with _connected(address) as (connection, reader):
        stream = Stream(connection)
        stream.send(b"hold")
        assert held.wait(10)
        grpc_server.stop(0)
        assert stream.ended.wait(10), "the stream did not end when the server stopped"
        (status,) = stream.status
        assert status is not None and status[0] in ("connection", "grpc_cancelled", "grpc_unavailable"), status
        reader.join(10)
        assert not reader.is_alive() and connection.is_closed  # the server closed the connection too
        with pytest.raises(ConnectionError):
            connection.open_stream(METHOD, lambda stamp, raw: None, lambda status: None)


def test_without_the_kernels_stamps_the_reader_stamps_each_read_and_counts_it(server, monkeypatch):
    """A platform without SO_TIMESTAMPNS: reads are stamped when the reader gets them, and counted (the bench notes it)."""
    from trtllm_forge.bench import grpc_wire

    monkeypatch.setattr(grpc_wire, "SO_TIMESTAMPNS", None)
    _, address = server
    with _connected(address) as (connection, _):
        stream = Stream(connection)
        stream.send(b"echo:2")
        connection.half_close(stream.stream)
        assert stream.ended.wait(10) and stream.status == [None]
        assert [raw for _, raw in stream.messages] == [b"echo:2"] * 2
        assert connection.client_stamped_reads > 0
        assert not connection.kernel_stamps


def test_a_server_that_is_not_http2_is_refused_at_connect():
    import socket

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def answer():
        peer, _ = listener.accept()
        peer.recv(1024)
        peer.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        peer.close()

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    connection = WireConnection(f"127.0.0.1:{port}")
    reader = threading.Thread(target=connection.serve, daemon=True)
    reader.start()
    assert connection.settled.wait(10)
    reader.join(10)
    assert connection.is_closed and connection.closed is not None and connection.closed[0] == "connection"
    listener.close()


def test_a_kernel_stamp_is_converted_with_the_clocks_read_close_together(monkeypatch):
    """A reader preempted between its monotonic and wall-clock reads would put a stamp early by as long: the clocks
    are read again and the tightest bracket is used. (The clocks are scripted here: preemption cannot be ordered.)"""
    from types import SimpleNamespace

    from trtllm_forge.bench import grpc_wire

    offset = 1_000_000_000_000  # wall clock − monotonic clock, in truth
    preempted = 300_000  # the first try loses 300 µs between its wall-clock read and its second monotonic read
    monotonic = iter([10_000_000, 10_000_100 + preempted, 20_000_000, 20_000_100])
    wall = iter([10_000_050 + offset, 20_000_050 + offset])
    monkeypatch.setattr(grpc_wire, "time", SimpleNamespace(perf_counter_ns=lambda: next(monotonic), time_ns=lambda: next(wall)))
    arrived = 19_000_000  # on the monotonic clock
    assert grpc_wire.kernel_stamp_to_perf_ns(arrived + offset) == arrived  # the first bracket alone: 150 µs off
