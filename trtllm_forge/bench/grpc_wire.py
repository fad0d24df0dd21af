"""gRPC streams over HTTP/2 on a socket we own, so that every response carries the kernel's receive stamp.

The bench's lanes (bench/target_grpc.py) keep one bidirectional ModelStreamInfer stream open per lane. Reading the
socket ourselves lets the kernel stamp each segment as it reaches the socket (SO_TIMESTAMPNS): a response's receive
time is when its bytes arrived, not when a client thread got a core and the GIL to look at it, which is the part of
TTFT and ITL that differed between benchmark clients on a loaded machine (README, "How our gRPC client stamps").

What is spoken is the part of HTTP/2 (RFC 9113) and gRPC's HTTP/2 mapping (grpc/doc/PROTOCOL-HTTP2.md) a client of
long-lived streams needs: the preface and SETTINGS (server push off), one HEADERS block per stream, length-prefixed
messages in DATA frames within the peer's flow-control windows, WINDOW_UPDATE for what we read, PING answered,
RST_STREAM both ways, GOAWAY, and the trailers' grpc-status / grpc-message. Header blocks are (de)compressed with
`hpack` (the h2 project's HPACK). Unary calls (model config, metadata, readiness) stay on grpcio.

Threads: one reader thread per connection runs `serve()` and calls the stream's callbacks; any thread may write
(frames are written whole under the connection's lock)."""

from __future__ import annotations

import contextlib
import socket
import struct
import sys
import threading
import time
import urllib.parse
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc
import hpack

from trtllm_forge import __version__

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM = ACK = 0x1
END_HEADERS, PADDED, PRIORITY_FLAG = 0x4, 0x8, 0x20
SETTING_HEADER_TABLE_SIZE, SETTING_ENABLE_PUSH, SETTING_INITIAL_WINDOW_SIZE, SETTING_MAX_FRAME_SIZE = 0x1, 0x2, 0x4, 0x5
LAST_STREAM_ID = (1 << 31) - 1
CANCEL, REFUSED_STREAM = 0x8, 0x7
DEFAULT_WINDOW = 65535
# What we let the server send before we acknowledge it, per stream and per connection: one update per ~512 MB read.
RECEIVE_WINDOW = 1 << 30
# Linux's option number (Python 3.11's socket module does not name it; the same on x86-64 and aarch64); elsewhere none.
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35 if sys.platform == "linux" else None)
_TIMESPEC = struct.Struct("qq")
_U32 = struct.Struct(">I")
_GRPC_PREFIX = struct.Struct(">BI")
_STATUS_BY_CODE = {status.value[0]: status for status in grpc.StatusCode}
READ_SIZE = 1 << 18

# (error kind, message) as the bench records a stream's failed end; None = ended OK.
StreamStatus = tuple[str, str] | None


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    return _U32.pack(len(payload))[1:] + bytes((kind, flags)) + _U32.pack(stream_id) + payload


def grpc_status(code: int, message: str) -> StreamStatus:
    """gRPC's status as the bench records a failed stream: UNAVAILABLE is a connection failure, others grpc_<name>."""
    status = _STATUS_BY_CODE.get(code, grpc.StatusCode.UNKNOWN)
    if status == grpc.StatusCode.OK:
        return None
    kind = "connection" if status == grpc.StatusCode.UNAVAILABLE else f"grpc_{status.name.lower()}"
    return kind, message or status.name


def _reset_status(error_code: int) -> StreamStatus:
    """A stream the server reset, mapped as grpc's clients map RST_STREAM codes."""
    if error_code == REFUSED_STREAM:
        return "connection", "the server refused the stream (RST_STREAM REFUSED_STREAM)"
    if error_code == CANCEL:
        return "grpc_cancelled", "the server cancelled the stream (RST_STREAM CANCEL)"
    return "grpc_internal", f"the server reset the stream (RST_STREAM error code {error_code})"


# Two reads of CLOCK_MONOTONIC closer than this bracket the wall-clock read between them well enough; a wider bracket
# means the reader was preempted in between (which put a stamp off by up to as long) and the clocks are read again.
TIGHT_CLOCK_BRACKET_NS = 20_000
_CLOCK_TRIES = 5


def kernel_stamp_to_perf_ns(kernel_realtime_ns: int) -> int:
    """The kernel's receive stamp (CLOCK_REALTIME) on `time.perf_counter_ns()`'s clock (CLOCK_MONOTONIC, the bench's),
    both clocks read at each conversion so that a step or slew of the wall clock during a run is followed: the wall
    clock between two monotonic reads, the tightest of a few tries when the thread was preempted between them."""
    best_bracket, offset, now = None, 0, 0
    for _ in range(_CLOCK_TRIES):
        before = time.perf_counter_ns()
        wall = time.time_ns()
        now = time.perf_counter_ns()
        if best_bracket is None or now - before < best_bracket:
            best_bracket, offset = now - before, wall - (before + now) // 2
        if best_bracket <= TIGHT_CLOCK_BRACKET_NS:
            break
    stamp = kernel_realtime_ns - offset
    return stamp if stamp <= now else now


@dataclass(eq=False)
class WireStream:
    """One gRPC stream: `on_message(stamp_ns, raw)` for each message, `on_end(status)` once when it ended."""

    id: int
    on_message: Callable[[int, bytes], None]
    on_end: Callable[[StreamStatus], None]
    send_window: int
    buffer: bytearray = field(default_factory=bytearray)
    unacknowledged: int = 0  # bytes received since our last WINDOW_UPDATE for this stream
    outbox: deque = field(default_factory=deque)  # [message bytes, offset, on_start] waiting for window
    headers_seen: bool = False
    closing: bool = False  # half-closed by us while messages still wait for window: END_STREAM follows them
    ended: bool = False


class WireConnection:
    """One HTTP/2 connection to a gRPC server (plain TCP, as grpc.insecure_channel), its streams and its reader."""

    def __init__(self, address: str, connect_timeout: float = 10.0):
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"not host:port: {address!r}")
        self.authority = address
        self.sock = socket.create_connection((host.strip("[]"), int(port)), timeout=connect_timeout)
        self.sock.settimeout(None)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.kernel_stamps = False  # whether the socket asks the kernel to stamp what it receives
        if SO_TIMESTAMPNS is not None:
            try:
                self.sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
                self.kernel_stamps = True
            except OSError:  # no kernel receive stamps: the reader stamps each read itself (client_stamped_reads)
                pass
        self.lock = threading.Lock()  # windows, streams, the encoder and every write
        self.encoder = hpack.Encoder()
        self.decoder = hpack.Decoder()
        self.streams: dict[int, WireStream] = {}
        self.next_stream_id = 1
        self.send_window = DEFAULT_WINDOW  # the connection's, as the server allows
        self.peer_initial_window = DEFAULT_WINDOW
        self.peer_max_frame = 16384
        self.unacknowledged = 0
        self.settled = threading.Event()  # the server's first SETTINGS came: the connection is up
        self.closed: StreamStatus = None  # why the connection closed, once it has
        self.client_stamped_reads = 0  # reads that came without the kernel's stamp (stamped by us instead)
        self.window_waits = 0  # times a message waited for the server's flow-control window
        self._header_block: tuple[int, int, bytearray] | None = None  # (stream id, flags, block) across CONTINUATION
        settings = struct.pack(">HIHI", SETTING_ENABLE_PUSH, 0, SETTING_INITIAL_WINDOW_SIZE, RECEIVE_WINDOW)
        self._write(PREFACE + frame(SETTINGS, 0, 0, settings) + frame(WINDOW_UPDATE, 0, 0, _U32.pack(RECEIVE_WINDOW - DEFAULT_WINDOW)))

    @property
    def is_closed(self) -> bool:
        return self.closed is not None

    @property
    def accepts_streams(self) -> bool:
        """Open, and not told by the server's GOAWAY to open no more streams."""
        return not self.is_closed and self.next_stream_id <= LAST_STREAM_ID

    # writing

    def _write(self, data: bytes) -> None:
        self.sock.sendall(data)

    def open_stream(self, path: bytes, on_message: Callable[[int, bytes], None], on_end: Callable[[StreamStatus], None]) -> WireStream:
        """Send a new stream's headers (POST `path`, application/grpc)."""
        headers = [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", path.decode()),
            (":authority", self.authority),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
            ("user-agent", f"trtllm-forge/{__version__}"),
        ]
        with self.lock:
            if not self.accepts_streams:
                raise ConnectionError(self.closed[1] if self.closed else "the connection takes no new stream")
            stream = WireStream(self.next_stream_id, on_message, on_end, self.peer_initial_window)
            self.next_stream_id += 2
            self.streams[stream.id] = stream
            self._write(frame(HEADERS, END_HEADERS, stream.id, self.encoder.encode(headers)))
        return stream

    def send_message(self, stream: WireStream, message: bytes, on_start: Callable[[], None] | None = None) -> bool:
        """Queue one gRPC message on `stream` and write what the flow-control windows allow now; `on_start` runs right
        before its first byte is written (with the lock held: keep it short). False when the stream has ended."""
        with self.lock:
            if stream.ended or self.is_closed:
                return False
            stream.outbox.append([_GRPC_PREFIX.pack(0, len(message)) + message, 0, on_start])
            if len(stream.outbox) == 1:
                self._flush(stream)
        return True

    def _flush(self, stream: WireStream) -> None:
        """Write queued messages of `stream` while both windows allow (lock held)."""
        while stream.outbox:
            entry = stream.outbox[0]
            data, offset, on_start = entry
            while offset < len(data):
                size = min(len(data) - offset, self.send_window, stream.send_window, self.peer_max_frame)
                if size <= 0:
                    entry[1] = offset
                    self.window_waits += 1
                    return
                if offset == 0 and on_start is not None:
                    on_start()
                self._write(frame(DATA, 0, stream.id, data[offset : offset + size]))
                offset += size
                self.send_window -= size
                stream.send_window -= size
            stream.outbox.popleft()
        if stream.closing:
            stream.closing = False
            self._write(frame(DATA, END_STREAM, stream.id))

    def half_close(self, stream: WireStream) -> None:
        """No more messages from us on `stream` (an empty DATA frame with END_STREAM): the server ends it with its status."""
        with self.lock:
            if stream.ended or self.is_closed:
                return
            if stream.outbox:  # after the messages still waiting for the server's window
                stream.closing = True
                return
            with contextlib.suppress(OSError):  # the connection is going: the reader reports it
                self._write(frame(DATA, END_STREAM, stream.id))

    def cancel(self, stream: WireStream, message: str) -> None:
        """Reset `stream` (RST_STREAM CANCEL): the server stops; its end is reported as cancelled."""
        with self.lock:
            if stream.ended or self.is_closed:
                return
            with contextlib.suppress(OSError):  # the connection is going: the stream ends here all the same
                self._write(frame(RST_STREAM, 0, stream.id, _U32.pack(CANCEL)))
            self._end_stream(stream, ("grpc_cancelled", message))

    def shutdown(self) -> None:
        """Close the socket: the reader's next read ends it, and every stream still open ends as a connection failure."""
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)

    # reading

    def serve(self) -> None:
        """The reader: frames until the connection closes. Each message is handed over with the kernel's receive stamp
        of the read that completed it (the newest segment in that read: when the reader falls behind, the stamp is the
        newest arrival, never later than the read itself)."""
        buffer = bytearray(READ_SIZE)
        view = memoryview(buffer)
        carried = bytearray()  # the start of a frame the last read did not complete
        reason = "the server closed the connection"
        try:
            while True:
                count, ancillary, _, _ = self.sock.recvmsg_into((view,), 64)
                if count == 0:
                    break
                stamp = 0
                for level, kind, data in ancillary:
                    if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS:
                        seconds, nanoseconds = _TIMESPEC.unpack_from(data)
                        stamp = kernel_stamp_to_perf_ns(seconds * 1_000_000_000 + nanoseconds)
                if not stamp:
                    stamp = time.perf_counter_ns()
                    self.client_stamped_reads += 1
                if carried:
                    carried += view[:count]
                    del carried[: self._frames(carried, len(carried), stamp)]
                else:
                    consumed = self._frames(buffer, count, stamp)
                    if consumed < count:
                        carried = bytearray(view[consumed:count])
                if self.is_closed:
                    break
        except OSError as exc:
            reason = f"connection error: {exc}"
        except ProtocolError as exc:
            reason = f"HTTP/2 protocol error: {exc}"
            self.shutdown()
        self._close(("connection", reason))
        self.sock.close()

    def _frames(self, data: bytearray, size: int, stamp: int) -> int:
        """Handle every whole frame in `data[:size]`; return how many bytes they took."""
        at = 0
        while size - at >= 9:
            end = at + 9 + ((data[at] << 16) | (data[at + 1] << 8) | data[at + 2])
            if end > size:
                break
            kind, flags = data[at + 3], data[at + 4]
            stream_id = _U32.unpack_from(data, at + 5)[0] & 0x7FFFFFFF
            if kind == DATA:
                self._data(flags, stream_id, data, at + 9, end, stamp)
            else:
                self._frame(kind, flags, stream_id, bytes(data[at + 9 : end]))
            at = end
        return at

    def _frame(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        """Every frame but DATA."""
        if self._header_block is not None and kind != CONTINUATION:
            raise ProtocolError("a header block was interrupted")
        if kind == HEADERS:
            payload = _unpad(flags, payload)
            if flags & PRIORITY_FLAG:
                payload = payload[5:]
            self._header_block = (stream_id, flags, bytearray(payload))
            if flags & END_HEADERS:
                self._headers_done()
        elif kind == CONTINUATION:
            if self._header_block is None or self._header_block[0] != stream_id:
                raise ProtocolError("CONTINUATION without its HEADERS")
            self._header_block[2].extend(payload)
            if flags & END_HEADERS:
                self._headers_done()
        elif kind == SETTINGS:
            if not flags & ACK:
                self._settings(payload)
        elif kind == PING:
            if not flags & ACK:
                with self.lock:
                    self._write(frame(PING, ACK, 0, payload))
        elif kind == WINDOW_UPDATE:
            self._window_update(stream_id, int.from_bytes(payload[:4], "big") & 0x7FFFFFFF)
        elif kind == RST_STREAM:
            stream = self.streams.get(stream_id)
            if stream is not None:
                with self.lock:
                    self._end_stream(stream, _reset_status(int.from_bytes(payload[:4], "big")))
        elif kind == GOAWAY:
            last_id = int.from_bytes(payload[:4], "big") & 0x7FFFFFFF
            error_code = int.from_bytes(payload[4:8], "big")
            note = payload[8:].decode("utf-8", "replace")
            reason = f"the server is going away (GOAWAY error code {error_code}{': ' + note if note else ''})"
            with self.lock:
                for stream in [s for s in self.streams.values() if s.id > last_id]:
                    self._end_stream(stream, ("connection", reason))
                if error_code or not self.streams:
                    self._close_locked(("connection", reason))
                else:
                    self.next_stream_id = LAST_STREAM_ID + 1  # the streams open finish; no new one here
        elif kind == PUSH_PROMISE:
            raise ProtocolError("PUSH_PROMISE after we disabled push")
        # PRIORITY and unknown frame types are ignored (RFC 9113, 4.1)

    def _data(self, flags: int, stream_id: int, data: bytearray, start: int, end: int, stamp: int) -> None:
        """A DATA frame's payload, data[start:end]: its messages go to the stream; what we read is acknowledged."""
        if self._header_block is not None:
            raise ProtocolError("a header block was interrupted")
        length = end - start
        self.unacknowledged += length
        stream = self.streams.get(stream_id)
        updates = []
        if self.unacknowledged >= RECEIVE_WINDOW // 2:
            updates.append(frame(WINDOW_UPDATE, 0, 0, _U32.pack(self.unacknowledged)))
            self.unacknowledged = 0
        if stream is not None and not stream.ended:
            stream.unacknowledged += length
            if stream.unacknowledged >= RECEIVE_WINDOW // 2 and not flags & END_STREAM:
                updates.append(frame(WINDOW_UPDATE, 0, stream.id, _U32.pack(stream.unacknowledged)))
                stream.unacknowledged = 0
        if updates:
            with self.lock:
                self._write(b"".join(updates))
        if stream is None or stream.ended:
            return  # a stream we reset: its late data only counts for the connection's window
        if flags & PADDED and length:
            start, end = start + 1, end - data[start]
        if stream.buffer:  # a message began in an earlier frame
            stream.buffer += data[start:end]
            data, start, end = stream.buffer, 0, len(stream.buffer)
        at = self._messages(stream, data, start, end, stamp)
        if stream.ended:
            return
        if data is stream.buffer:
            del stream.buffer[:at]
        elif at < end:
            stream.buffer += data[at:end]
        if flags & END_STREAM:
            with self.lock:
                self._end_stream(stream, ("connection", "the stream ended without a gRPC status"))

    def _messages(self, stream: WireStream, data: bytearray, at: int, end: int, stamp: int) -> int:
        """Hand over every whole length-prefixed message in data[at:end]; return where the first incomplete one starts."""
        while end - at >= 5:
            compressed, length = _GRPC_PREFIX.unpack_from(data, at)
            if at + 5 + length > end:
                break
            if compressed:
                with self.lock:
                    self._write(frame(RST_STREAM, 0, stream.id, _U32.pack(CANCEL)))
                    self._end_stream(stream, ("grpc_internal", "the server sent a compressed message (none was offered)"))
                return at
            stream.on_message(stamp, bytes(data[at + 5 : at + 5 + length]))
            at += 5 + length
        return at

    def _headers_done(self) -> None:
        assert self._header_block is not None
        stream_id, flags, block = self._header_block
        self._header_block = None
        # every block is decoded, even a stream's we forgot: HPACK's table is the connection's
        decoded = self.decoder.decode(bytes(block), raw=True)
        headers = {bytes(name).decode("latin-1"): bytes(value).decode("utf-8", "replace") for name, value in decoded}
        stream = self.streams.get(stream_id)
        if stream is None or stream.ended:
            return
        if not stream.headers_seen and ":status" in headers:
            stream.headers_seen = True
            if headers[":status"] != "200":
                with self.lock:
                    self._end_stream(stream, ("connection", f"HTTP status {headers[':status']} (not a gRPC server?)"))
                return
        if flags & END_STREAM or "grpc-status" in headers:
            code = headers.get("grpc-status", "")
            if code.isdigit():
                status = grpc_status(int(code), urllib.parse.unquote(headers.get("grpc-message", "")))
            else:
                status = ("grpc_unknown", "the stream ended without a gRPC status")
            with self.lock:
                self._end_stream(stream, status)

    def _settings(self, payload: bytes) -> None:
        with self.lock:
            for at in range(0, len(payload) - len(payload) % 6, 6):
                setting, value = struct.unpack_from(">HI", payload, at)
                if setting == SETTING_INITIAL_WINDOW_SIZE:
                    delta = value - self.peer_initial_window
                    self.peer_initial_window = value
                    for stream in self.streams.values():
                        stream.send_window += delta
                elif setting == SETTING_MAX_FRAME_SIZE:
                    self.peer_max_frame = value
                elif setting == SETTING_HEADER_TABLE_SIZE:
                    self.encoder.header_table_size = value  # the next header block tells the server's decoder
            self._write(frame(SETTINGS, ACK, 0))
            for stream in list(self.streams.values()):
                self._flush(stream)
        self.settled.set()

    def _window_update(self, stream_id: int, increment: int) -> None:
        with self.lock:
            if stream_id == 0:
                self.send_window += increment
                streams = list(self.streams.values())
            else:
                stream = self.streams.get(stream_id)
                if stream is None:
                    return
                stream.send_window += increment
                streams = [stream]
            for stream in streams:
                if stream.outbox and not stream.ended:
                    self._flush(stream)

    def _end_stream(self, stream: WireStream, status: StreamStatus) -> None:
        """(lock held) `stream` ended with `status`: forget it and tell its owner once."""
        if stream.ended:
            return
        stream.ended = True
        stream.outbox.clear()
        self.streams.pop(stream.id, None)
        stream.on_end(status)

    def _close_locked(self, status: tuple[str, str]) -> None:
        if self.is_closed:
            return
        self.closed = status
        for stream in list(self.streams.values()):
            self._end_stream(stream, status)

    def _close(self, status: tuple[str, str]) -> None:
        with self.lock:
            self._close_locked(status)
        self.settled.set()


class ProtocolError(Exception):
    """The server broke HTTP/2's rules: the connection is closed."""


def _unpad(flags: int, payload: bytes) -> bytes:
    if flags & PADDED and payload:
        return payload[1 : len(payload) - payload[0]]
    return payload
