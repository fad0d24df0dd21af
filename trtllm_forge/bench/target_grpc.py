"""Triton gRPC streaming targets: the text contract of the ensemble / tensorrt_llm_bls model, and token ids
straight to the tensorrt_llm model. Uses tritonclient's protobuf messages on HTTP/2 connections of our own
(bench/grpc_wire.py: each response carries the kernel's receive stamp), skipping its InferResult wrapper. Each
lane keeps one ModelStreamInfer stream open that carries request after request; the lane's reader thread routes
each stamped response to its request and reads it there (see _Lane)."""

from __future__ import annotations

import asyncio
import contextlib
import struct
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import grpc
from google.protobuf.json_format import MessageToDict
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from trtllm_forge.bench.grpc_wire import WireConnection, WireStream
from trtllm_forge.bench.records import RequestRecord
from trtllm_forge.bench.target import UNREACHABLE_END_ID, Target, TargetDown, now_ns, output_length_plan, wait_done
from trtllm_forge.bench.workload import BenchRequest
from trtllm_forge.errors import StepError

PERF_OUTPUTS = ("arrival_time_ns", "first_scheduled_time_ns", "first_token_time_ns", "last_token_time_ns")
_CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 64 << 20),
    ("grpc.max_send_message_length", 64 << 20),
    # After a server restart the readiness call waits at most 2 s (_lane): grpcio's reconnect backoff (1 s, growing
    # by 1.6x to 120 s) would otherwise let a server that has been back for seconds look down.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]
_STREAM_METHOD = b"/inference.GRPCInferenceService/ModelStreamInfer"


InputSpec = tuple[str, str, list[Any]]  # (input name, Triton datatype, values)


def _bytes_tensor(values: list[bytes]) -> bytes:
    return b"".join(struct.pack("<I", len(v)) + v for v in values)


def _pack(datatype: str, values: list) -> bytes:
    if datatype == "BYTES":
        return _bytes_tensor([v.encode() for v in values])
    if datatype == "BOOL":
        return bytes(int(bool(v)) for v in values)
    return struct.pack(f"<{len(values)}i", *values)


def _first_bytes(raw: bytes) -> bytes:
    if len(raw) < 4:
        return b""
    (length,) = struct.unpack_from("<I", raw, 0)
    return raw[4 : 4 + length]


@dataclass(slots=True)
class _Pending:
    """A request on a lane's stream: its record, the loop's future, and the responses its server stamps are read
    from at the end (the first and the latest two: see _Lane._finish)."""

    record: RequestRecord
    done: asyncio.Future
    perf_responses: list = field(default_factory=list)


def _resolve(done: asyncio.Future) -> None:
    if not done.done():
        done.set_result(None)


def _close_all(lanes: list[_Lane]) -> None:
    for lane in lanes:
        lane.close()
    deadline = time.monotonic() + 5
    for lane in lanes:
        lane.join(max(0.0, deadline - time.monotonic()))


@dataclass(frozen=True, slots=True)
class _Layout:
    """Where a response with `count` outputs keeps the ones read on every response (indexes into its outputs and
    raw_output_contents). Learned by name from the first such response and checked by name at those indexes on
    each: walking every output of every response (each a new Python object) cost a flood ~8 us per response."""

    count: int
    text: int | None
    tokens: int | None
    send: int | None

    @classmethod
    def read(cls, outputs: Sequence[Any]) -> _Layout:
        index = {output.name: i for i, output in enumerate(outputs)}
        return cls(len(outputs), index.get("text_output"), index.get("num_output_tokens"), index.get("send_time_ns"))

    def holds(self, outputs: Sequence[Any]) -> bool:
        return (
            (self.tokens is None or outputs[self.tokens].name == "num_output_tokens")
            and (self.send is None or outputs[self.send].name == "send_time_ns")
            and (self.text is None or outputs[self.text].name == "text_output")
        )


def read_perf(response: Any, record: RequestRecord) -> None:
    """The model's return_perf_metrics stamps in `response`, by name (later responses overwrite earlier ones)."""
    for output, raw in zip(response.outputs, response.raw_output_contents, strict=False):
        if output.name in PERF_OUTPUTS and raw:
            if record.server_perf is None:
                record.server_perf = {}
            record.server_perf[output.name] = struct.unpack_from("<q", raw, 0)[0]


_DECODE = pb.ModelStreamInferResponse.FromString
_FINAL = "triton_final_response"


class _Lane:
    """One persistent bidirectional ModelStreamInfer stream on an HTTP/2 connection of its own (grpc_wire), and the
    connection's reader thread (as perf_analyzer keeps one stream per concurrency slot).

    Requests are written onto the open stream by the event loop's thread (no call set-up per request: no new
    HTTP/2 stream, no headers), the send stamp taken right before the first byte is written. A response's receive
    stamp is the kernel's, of the read that completed it (grpc_wire.WireConnection.serve): when the segment reached
    the socket, however late the reader thread got a core and the GIL. The reader decodes each response, finds its
    request (by id: a lane may carry several requests at once) and reads what it carried as it comes, so a request's
    end is told to the loop right after its final response (reading a flood request's 257 responses only then put
    ~2.9 ms between a final response and the next send at concurrency 1, perf_analyzer ~1.7 ms; now ~0.7 ms).
    The process's GIL switch interval is left as it is: a lower one (0.2 ms, kept while the reader stamped) had
    waiting threads wake every 0.2 ms, and with the kernel's stamps it no longer bought accuracy."""

    def __init__(self, target: TritonGrpcTarget, loop: asyncio.AbstractEventLoop):
        self.target = target
        self.loop = loop
        self.pending: dict[str, _Pending] = {}
        self.connection: WireConnection | None = None
        self.stream: WireStream | None = None
        self.thread: threading.Thread | None = None
        self.broken: tuple[str, str] | None = None  # (error kind, message) when the connection failed
        self.live = False  # the stream is up: set when opened, cleared as soon as its end is seen
        self.cancelled = False  # the stream was cancelled: it ends, and the next request opens a new one
        self.ended = threading.Event()  # the stream's end was seen

    @property
    def open(self) -> bool:
        return self.live and self.thread is not None and self.thread.is_alive()

    @property
    def connected(self) -> bool:
        return self.connection is not None and self.connection.accepts_streams and self.thread is not None and self.thread.is_alive()

    def connect(self, timeout: float = 10.0) -> None:
        """A new connection and its reader thread, once the server's SETTINGS came (blocking: run off the loop)."""
        if self.connection is not None:
            self.connection.shutdown()  # closed, failed, or draining after the server's GOAWAY with no stream of ours
        if self.thread is not None:
            self.thread.join(timeout=5)
        try:
            self.connection = connection = WireConnection(self.target.url, timeout)
        except OSError as exc:
            raise TargetDown(f"cannot connect to {self.target.url}: {exc}") from None
        self.thread = threading.Thread(target=connection.serve, name="bench-grpc-lane", daemon=True)
        self.thread.start()
        if not connection.settled.wait(timeout) or connection.is_closed:
            connection.shutdown()
            raise TargetDown(f"{self.target.url} did not answer as an HTTP/2 server within {timeout:g} s")

    def start(self) -> None:
        """Open a stream on the lane's connection."""
        assert self.connection is not None
        self.ended.clear()
        self.live, self.cancelled = True, False
        try:
            self.stream = self.connection.open_stream(_STREAM_METHOD, self._route, self._end)
        except (ConnectionError, OSError) as exc:
            self.live = False
            raise TargetDown(str(exc)) from None

    def submit(self, record: RequestRecord, payload: bytes, done: asyncio.Future) -> None:
        """Called by the event loop's thread: write `payload` onto the stream (now, or when the server's flow-control
        window allows)."""
        entry = _Pending(record, done)
        record.recv_ns = []  # filled as responses come: the runner's stall watchdog reads the last stamp
        self.pending[record.id] = entry

        def stamp_send() -> None:
            record.sent_ns = now_ns()

        assert self.connection is not None and self.stream is not None
        try:
            written = self.connection.send_message(self.stream, payload, stamp_send)
        except OSError as exc:
            written = False
            self.broken = ("connection", str(exc))
        if not written:
            self._fail(entry, "connection", "the stream had ended before the request was written")

    def _route(self, stamp: int, raw: bytes) -> None:
        message = _DECODE(raw)
        response = message.infer_response
        entry = self.pending.get(response.id)
        if entry is None:
            entries = list(self.pending.values())  # a snapshot: the loop's thread adds requests meanwhile
            if not message.error_message or len(entries) != 1:
                return  # a late response of a request that timed out or had ended
            entry = entries[0]  # an error without the request's id: the one request on this stream
        record = entry.record
        if message.error_message:
            if record.error_kind is None:
                record.error_kind, record.error_message = "server_error", message.error_message
            final = True
        else:
            record.recv_ns.append(stamp)
            try:
                final = self.target.parse_response(response, record)
            except Exception as exc:
                record.error_kind, record.error_message = "client_error", f"cannot read a response: {type(exc).__name__}: {exc}"
                final = True
            if self.target.perf:
                kept = entry.perf_responses
                kept.append(response)
                if len(kept) > 3:
                    del kept[1]
        if final:
            self.pending.pop(record.id, None)
            self._finish(entry)

    def _fail(self, entry: _Pending, kind: str, message: str) -> None:
        record = entry.record
        if self.pending.pop(record.id, None) is None:
            return
        if record.error_kind is None:
            record.error_kind, record.error_message = kind, message
        self._finish(entry)

    def _end(self, status: tuple[str, str] | None) -> None:
        """The stream ended (the server, a cancel or the connection closed it): every request still on it ends with
        that error."""
        self.live = False
        kind, message = status or ("connection", "the stream ended without a final response")
        if status is not None and kind == "connection":
            self.broken = status
        for entry in list(self.pending.values()):
            self._fail(entry, kind, message)
        self.ended.set()

    def _finish(self, entry: _Pending) -> None:
        """The request ended: read the model's stamps and tell the loop."""
        # arrival / first_scheduled / first_token are the same in every response, last_token is the last one's (the
        # final response is often empty): read from the first and the last two responses, not from each
        for response in entry.perf_responses:
            read_perf(response, entry.record)
        with contextlib.suppress(RuntimeError):  # the event loop closed under a lane that was never closed
            self.loop.call_soon_threadsafe(_resolve, entry.done)

    def cancel(self, record: RequestRecord) -> None:
        """`record`'s timeout passed: forget it; when it was the only request on the stream, end the stream so
        the server stops working on it (the next request opens a new one)."""
        entry = self.pending.pop(record.id, None)
        if entry is not None and not self.pending and self.stream is not None and self.connection is not None:
            self.cancelled = True
            self.connection.cancel(self.stream, "request timed out")

    def close(self) -> None:
        """Half-close an idle stream (the server ends it cleanly), cancel one with requests on it."""
        if self.connection is None or self.stream is None or not self.live:
            return
        if self.pending:
            self.connection.cancel(self.stream, "bench closed")
        else:
            self.connection.half_close(self.stream)

    def join(self, timeout: float) -> None:
        """Wait for the stream's end (a stream the server has not ended by then is cancelled), then close the
        connection and wait for its reader."""
        if self.connection is None or self.thread is None:
            return
        if self.live and not self.ended.wait(timeout) and self.stream is not None:
            self.connection.cancel(self.stream, "bench closed")
        self.connection.shutdown()
        self.thread.join(timeout=5)


class TritonGrpcTarget(Target):
    """Text in, text out: `text_input`, `max_tokens`, `stream`, sampling inputs → `text_output`."""

    kind = "triton-grpc"

    def __init__(self, *args: Any, streams: int = 1, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.n_streams = max(1, streams)
        self.channel: grpc.Channel | None = None  # grpcio, for the unary calls (config, metadata, readiness)
        self.stub: pb_grpc.GRPCInferenceServiceStub | None = None
        self.lanes: list[_Lane] = []
        self.inputs: dict[str, dict] = {}
        self.outputs: set[str] = set()
        self.batched = False
        self.layouts: dict[int, _Layout] = {}  # by output count (see _Layout)

    async def open(self) -> None:
        """Read the model's config, connect every lane and open its stream; on failure nothing is left open."""
        try:
            await self._open()
        except BaseException:
            await self.close()
            raise

    async def _open(self) -> None:
        self.channel = grpc.insecure_channel(self.url, options=_CHANNEL_OPTIONS)
        self.stub = stub = pb_grpc.GRPCInferenceServiceStub(self.channel)
        try:
            config = await asyncio.to_thread(stub.ModelConfig, pb.ModelConfigRequest(name=self.model), timeout=10)
            metadata = await asyncio.to_thread(stub.ServerMetadata, pb.ServerMetadataRequest(), timeout=10)
        except grpc.RpcError as exc:
            raise StepError(
                "--url",
                f"cannot read model {self.model!r} at {self.url}: {exc.details() if isinstance(exc, grpc.Call) else exc}",
                "check --url, --model and that the server is up",
            ) from None
        self.info.server_version = metadata.version
        data = MessageToDict(config.config, preserving_proto_field_name=True)
        self.batched = int(data.get("max_batch_size", 0)) > 0
        self.inputs = {i["name"]: i for i in data.get("input", [])}
        self.outputs = {o["name"] for o in data.get("output", [])}
        self.check_contract()
        self.perf = "return_perf_metrics" in self.inputs and "first_token_time_ns" in self.outputs
        if self.perf:
            self.info.notes.append("server timestamps requested (return_perf_metrics)")
        loop = asyncio.get_running_loop()
        self.lanes = [_Lane(self, loop) for _ in range(self.n_streams)]
        # Connect every lane now: a request must not carry a connection set-up in its TTFT.
        try:
            await asyncio.gather(*(asyncio.to_thread(lane.connect) for lane in self.lanes))
        except TargetDown as exc:
            raise StepError(
                "--url", f"cannot open {self.n_streams} connections to {self.url}: {exc}", "check the server, or pass a smaller --streams"
            ) from None
        for lane in self.lanes:
            lane.start()
        self.info.notes.append(
            f"{self.n_streams} ModelStreamInfer stream(s) kept open, each on an HTTP/2 connection of its own read by its own thread; "
            "requests matched by id; "
            + (
                "receive stamps from the kernel (SO_TIMESTAMPNS)"
                if all(lane.connection is not None and lane.connection.kernel_stamps for lane in self.lanes)
                else "receive stamps taken by the client's reader threads (no kernel receive stamps on this platform)"
            )
        )

    # NVIDIA's llmapi model names the same inputs differently and streams the whole text so far in each response.
    LLMAPI_NAMES: ClassVar[dict[str, str]] = {
        "max_tokens": "sampling_param_max_tokens",
        "stream": "streaming",
        "exclude_input_in_output": "sampling_param_exclude_input_from_output",
    }

    def check_contract(self) -> None:
        self.llmapi = "sampling_param_max_tokens" in self.inputs and "max_tokens" not in self.inputs
        self.names = self.LLMAPI_NAMES if self.llmapi else {n: n for n in self.LLMAPI_NAMES}
        self.seen_text: dict[str, str] = {}
        if self.llmapi:
            self.info.notes.append("llmapi model: sampling_param_* inputs; streamed text_output is cumulative")
        missing = [name for name in ("text_input", self.names["max_tokens"]) if name not in self.inputs]
        if missing or "text_output" not in self.outputs:
            raise StepError(
                "--target",
                f"model {self.model!r} does not speak the text contract (missing {', '.join(missing) or 'text_output'})",
                "use the ensemble or tensorrt_llm_bls model, or --target triton-grpc-tokens for tensorrt_llm",
            )
        self.length_input, self.end_id, self.info.forced_output_len = output_length_plan(self.inputs, self.force_output_len)
        self.count_server = "return_num_output_tokens" in self.inputs and "num_output_tokens" in self.outputs
        if self.force_output_len and self.info.forced_output_len is None:
            self.info.notes.append("the model has no min_tokens, min_length or end_id input: output length not forced")
        self.info.output_tokens_source = "server_count" if self.count_server else ("client_tokenizer" if self.tokenizer else "responses")

    def request_inputs(self, request: BenchRequest) -> list[tuple[str, str, list]]:
        """The inputs one request sends, as (name, Triton datatype, values), only those the model declares.
        bench sends them over its own stream; `bench --tool` writes the same ones for perf_analyzer."""
        n = request.output_tokens
        spec: list[InputSpec] = [
            ("text_input", "BYTES", [request.prompt]),
            (self.names["max_tokens"], "INT32", [n]),
            (self.names["stream"], "BOOL", [True]),
            (self.names["exclude_input_in_output"], "BOOL", [True]),
        ]
        return [item for item in spec + self._common_inputs(n) if item[0] in self.inputs]

    def _common_inputs(self, n: int) -> list[InputSpec]:
        spec: list[InputSpec] = []
        if self.count_server and "return_num_output_tokens" in self.inputs:
            spec.append(("return_num_output_tokens", "BOOL", [True]))
        if self.perf:
            spec.append(("return_perf_metrics", "BOOL", [True]))
        if self.length_input:
            spec.append((self.length_input, "INT32", [n]))
        if self.end_id:
            spec.append(("end_id", "INT32", [UNREACHABLE_END_ID]))
        return spec

    def build(self, request: BenchRequest, request_id: str) -> pb.ModelInferRequest:
        message = pb.ModelInferRequest(model_name=self.model, id=request_id)
        message.parameters["triton_enable_empty_final_response"].bool_param = True
        for name, datatype, values in self.request_inputs(request):
            shape = [1, len(values)] if self.batched else [len(values)]
            message.inputs.append(pb.ModelInferRequest.InferInputTensor(name=name, datatype=datatype, shape=shape))
            message.raw_input_contents.append(_pack(datatype, values))
        return message

    def parse_response(self, response: Any, record: RequestRecord) -> bool:
        """Record what one response carried (its stamp is already in `record.recv_ns`); return whether it was the final one.
        Only the outputs used are read, by position (_Layout); the text only when it is counted or kept."""
        outputs = response.outputs
        raws = response.raw_output_contents
        layout = self._layout(outputs)
        text = None
        if layout.text is not None and (self.llmapi or record.texts is not None or not self.count_server):
            text = _first_bytes(raws[layout.text]).decode("utf-8", "replace")
            if self.llmapi:  # cumulative → the new part
                previous = self.seen_text.get(record.id, "")
                self.seen_text[record.id] = text
                text = text[len(previous) :] if text.startswith(previous) else text
        if self.count_server:
            raw = raws[layout.tokens] if layout.tokens is not None else b""
            tokens = struct.unpack_from("<i", raw, 0)[0] if raw else 0
        else:
            tokens = 1 if text else 0
        server_ns = None
        if layout.send is not None:
            raw = raws[layout.send]
            server_ns = struct.unpack_from("<q", raw, 0)[0] if raw else None
        final = response.parameters[_FINAL].bool_param
        if final:
            self.seen_text.pop(record.id, None)
            if not layout.count:
                tokens, text = 0, None
        record.add_content(tokens, text, final, server_ns)
        return final

    def _layout(self, outputs: Sequence[Any]) -> _Layout:
        count = len(outputs)
        layout = self.layouts.get(count)
        if layout is None or not layout.holds(outputs):
            layout = self.layouts[count] = _Layout.read(outputs)
        return layout

    async def _lane(self) -> _Lane:
        """The lane with the fewest requests on it (the first such: at a concurrency up to --streams, every
        request in flight has a stream to itself). A stream that ended (cancelled after a timeout, or closed by
        the server) is opened again; after a connection failure, the server must answer first."""
        lane = min(self.lanes, key=lambda lane: len(lane.pending))
        if lane.broken is not None:
            try:
                assert self.stub is not None
                # wait_for_ready: grpcio's channel may still be backing off from the failure; a server back within 2 s counts
                await asyncio.to_thread(self.stub.ServerReady, pb.ServerReadyRequest(), timeout=2, wait_for_ready=True)
            except grpc.RpcError as exc:
                raise TargetDown((exc.details() if isinstance(exc, grpc.Call) else None) or "server unreachable") from None
            lane.broken = None
            await asyncio.to_thread(lane.connect)  # a connection that failed is not used again
        elif not lane.connected and not lane.open:  # a stream still open on a draining connection carries on
            await asyncio.to_thread(lane.connect)
        if lane.cancelled or not lane.open:
            lane.start()
        return lane

    async def send(self, request: BenchRequest, record: RequestRecord) -> None:
        payload = self.build(request, record.id).SerializeToString()
        if self.tokenizer is not None and not self.count_server:
            record.texts = []
        record.output_tokens_source = self.info.output_tokens_source
        done = asyncio.get_running_loop().create_future()
        try:
            lane = await self._lane()
        except TargetDown as exc:
            record.sent_ns = now_ns()
            record.error_kind, record.error_message = "connection", str(exc)
            raise
        lane.submit(record, payload, done)
        try:
            await wait_done(done, record, self.request_timeout)
        except asyncio.CancelledError:  # the runner gave up on it (stall, interrupt)
            lane.cancel(record)
            raise
        if record.error_kind == "timeout":
            lane.cancel(record)
        if not record.sent_ns:  # never handed to the transport
            record.sent_ns = now_ns()

    async def close(self) -> None:
        lanes, self.lanes = self.lanes, []
        if lanes:
            await asyncio.to_thread(_close_all, lanes)
        if self.channel is not None:
            self.channel.close()
            self.channel = None


class TritonGrpcTokensTarget(TritonGrpcTarget):
    """Token ids straight to the tensorrt_llm model: `input_ids`, `input_lengths`, `request_output_len`,
    `streaming`, `end_id` → `output_ids`; output counts are exact (no detokenisation)."""

    kind = "triton-grpc-tokens"

    def check_contract(self) -> None:
        missing = [n for n in ("input_ids", "input_lengths", "request_output_len") if n not in self.inputs]
        if missing or "output_ids" not in self.outputs:
            raise StepError(
                "--target",
                f"model {self.model!r} does not take token ids (missing {', '.join(missing) or 'output_ids'})",
                "point --model at the tensorrt_llm model, or use --target triton-grpc for the ensemble",
            )
        self.length_input, self.end_id, self.info.forced_output_len = output_length_plan(
            self.inputs, self.force_output_len, "request_output_len"
        )
        self.count_server = True
        self.info.output_tokens_source = "server_ids"

    def request_inputs(self, request: BenchRequest) -> list[tuple[str, str, list]]:
        if request.input_ids is None:
            raise StepError("--tokenizer", "the token-id target needs token ids", "pass --tokenizer DIR or a dataset with input_ids")
        ids, n = list(request.input_ids), request.output_tokens
        spec: list[InputSpec] = [
            ("input_ids", "INT32", ids),
            ("input_lengths", "INT32", [len(ids)]),
            ("request_output_len", "INT32", [n]),
            ("streaming", "BOOL", [True]),
            ("exclude_input_in_output", "BOOL", [True]),
        ]
        # output_ids are counted directly: no return_num_output_tokens
        return [item for item in spec + self._common_inputs(n) if item[0] in self.inputs and item[0] != "return_num_output_tokens"]

    def parse_response(self, response: Any, record: RequestRecord) -> bool:
        tokens = 0
        server_ns = None
        for output, raw in zip(response.outputs, response.raw_output_contents, strict=False):
            if output.name == "output_ids":
                tokens = output.shape[-1] if output.shape else len(raw) // 4
            elif output.name == "send_time_ns" and raw:
                server_ns = struct.unpack_from("<q", raw, 0)[0]
        final = response.parameters[_FINAL].bool_param
        record.add_content(tokens, None, final, server_ns)
        return final
