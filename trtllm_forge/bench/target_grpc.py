"""Triton gRPC streaming targets: the text contract of the ensemble / tensorrt_llm_bls model, and token ids
straight to the tensorrt_llm model. Uses tritonclient's protobuf messages over grpc's threaded (sync) API,
skipping its InferResult wrapper, so that every response is stamped in grpc's own thread the moment the
message is handed over, not when the event loop gets round to it (see _Stream)."""

from __future__ import annotations

import asyncio
import itertools
import queue
import struct
import threading
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.json_format import MessageToDict
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from trtllm_forge.bench.records import RequestRecord
from trtllm_forge.bench.target import UNREACHABLE_END_ID, Target, TargetDown, now_ns, output_length_plan, wait_done
from trtllm_forge.bench.workload import BenchRequest
from trtllm_forge.errors import StepError

PERF_OUTPUTS = ("arrival_time_ns", "first_scheduled_time_ns", "first_token_time_ns", "last_token_time_ns")
_CHANNEL_OPTIONS = [("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)]
_STREAM_METHOD = "/inference.GRPCInferenceService/ModelStreamInfer"
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
class _Outgoing:
    record: RequestRecord
    payload: bytes  # the serialized ModelInferRequest


def _stamp_sent(item: _Outgoing) -> bytes:
    """grpc's request serializer, called in grpc's sending thread just before the bytes go to the transport."""
    item.record.sent_ns = now_ns()
    return item.payload


def _stamp_received(raw: bytes) -> tuple[int, bytes]:
    """grpc's response deserializer, called in the channel's completion thread as soon as a message is there."""
    return now_ns(), raw


def _resolve(done: asyncio.Future) -> None:
    if not done.done():
        done.set_result(None)


def _close_all(streams: list["_Stream"]) -> None:
    for stream in streams:
        stream.close()


class _Stream:
    """One bidirectional ModelStreamInfer stream on its own channel (own TCP connection), run by threads.

    With grpc.aio a response waits for grpc's poller thread, then the event loop, then the reading
    coroutine before it can be stamped (two thread wake-ups and several loop turns: milliseconds on a busy
    machine). Here the receive stamp is taken by the response deserializer, which grpc calls in the channel's
    completion thread when the message is handed over; the send stamp by the request serializer, right before
    the serialized request goes to the transport. A reader thread parses and routes the responses and tells
    the event loop only that a request has ended."""

    def __init__(self, target: "TritonGrpcTarget", channel: grpc.Channel, loop: asyncio.AbstractEventLoop):
        self.target = target
        self.loop = loop
        self.pending: dict[str, tuple[RequestRecord, asyncio.Future]] = {}
        self.broken: BaseException | None = None
        self.outbox: queue.SimpleQueue[_Outgoing | None] = queue.SimpleQueue()
        method = channel.stream_stream(_STREAM_METHOD, request_serializer=_stamp_sent, response_deserializer=_stamp_received)
        self.call = method(iter(self.outbox.get, None))
        self.reader = threading.Thread(target=self._read, name="bench-grpc-stream", daemon=True)
        self.reader.start()

    def _read(self) -> None:
        parse = self.target.parse_response
        pending = self.pending
        decode = pb.ModelStreamInferResponse.FromString
        try:
            for stamp, raw in self.call:
                message = decode(raw)
                response = message.infer_response
                entry = pending.get(response.id)
                if entry is None:
                    continue
                record, done = entry
                if message.error_message:
                    record.error_kind, record.error_message = "server_error", message.error_message
                    final = True
                else:
                    final = parse(response, record, stamp)
                if final:
                    pending.pop(response.id, None)
                    self.loop.call_soon_threadsafe(_resolve, done)
            raise ConnectionError("stream closed by the server")
        except (grpc.RpcError, ConnectionError) as exc:
            self.fail(exc)
        except RuntimeError:  # the event loop closed under a stream that was never closed
            pass

    def fail(self, exc: BaseException) -> None:
        """End every request in flight on this stream as an error (from the reader thread or a failed send)."""
        self.broken = exc
        kind, message = "connection", str(exc)
        if isinstance(exc, grpc.Call) and isinstance(exc, grpc.RpcError):
            code = exc.code()
            kind = "connection" if code == grpc.StatusCode.UNAVAILABLE else f"grpc_{code.name.lower()}"
            message = exc.details() or code.name
        for key, (record, done) in list(self.pending.items()):
            if self.pending.pop(key, None) is None:
                continue
            if record.error_kind is None:
                record.error_kind, record.error_message = kind, message or type(exc).__name__
            self.loop.call_soon_threadsafe(_resolve, done)

    def write(self, record: RequestRecord, payload: bytes, done: asyncio.Future) -> None:
        self.pending[record.id] = (record, done)
        self.outbox.put(_Outgoing(record, payload))
        if self.broken is not None and self.pending.pop(record.id, None) is not None:  # broke while queuing
            record.error_kind = record.error_kind or "connection"
            record.error_message = record.error_message or "stream broken before the request was sent"
            _resolve(done)

    def close(self) -> None:
        self.outbox.put(None)
        self.call.cancel()
        self.reader.join(timeout=5)


class TritonGrpcTarget(Target):
    """Text in, text out: `text_input`, `max_tokens`, `stream`, sampling inputs → `text_output`."""

    kind = "triton-grpc"

    def __init__(self, *args, streams: int = 1, **kwargs):
        super().__init__(*args, **kwargs)
        self.n_streams = max(1, streams)
        self.channels: list[grpc.Channel] = []
        self.stub: pb_grpc.GRPCInferenceServiceStub | None = None
        self.streams: list[_Stream] = []
        self._next = itertools.count()
        self.inputs: dict[str, dict] = {}
        self.outputs: set[str] = set()
        self.batched = False

    async def open(self) -> None:
        # One channel (own TCP connection and completion thread) per stream: Triton writes the responses of
        # one stream one at a time, so a single stream carrying many requests backs up inside the server.
        self.channels = [
            grpc.insecure_channel(self.url, options=_CHANNEL_OPTIONS + [("grpc.use_local_subchannel_pool", 1)])
            for _ in range(self.n_streams)
        ]
        self.stub = stub = pb_grpc.GRPCInferenceServiceStub(self.channels[0])
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
        # Connect every channel now: a request must not carry a connection set-up in its TTFT.
        try:
            await asyncio.to_thread(lambda: [grpc.channel_ready_future(channel).result(timeout=10) for channel in self.channels])
        except grpc.FutureTimeoutError:
            raise StepError(
                "--url",
                f"cannot open {self.n_streams} connections to {self.url} within 10 s",
                "check the server, or pass a smaller --streams",
            ) from None
        loop = asyncio.get_running_loop()
        self.streams = [_Stream(self, channel, loop) for channel in self.channels]
        self.info.notes.append(f"{self.n_streams} gRPC stream(s), one connection each")

    # NVIDIA's llmapi model names the same inputs differently and streams the whole text so far in each response.
    LLMAPI_NAMES = {
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

    def parse_response(self, response, record: RequestRecord, stamp: int) -> bool:
        """Record one response; return whether it was the final one."""
        tokens = 0
        text = None
        server_ns = None
        for output, raw in zip(response.outputs, response.raw_output_contents):
            name = output.name
            if name == "text_output":
                text = _first_bytes(raw).decode("utf-8", "replace")
                if self.llmapi:  # cumulative → the new part
                    previous = self.seen_text.get(record.id, "")
                    self.seen_text[record.id] = text
                    text = text[len(previous) :] if text.startswith(previous) else text
            elif name == "num_output_tokens":
                tokens = struct.unpack_from("<i", raw, 0)[0] if raw else 0
            elif name == "send_time_ns":
                server_ns = struct.unpack_from("<q", raw, 0)[0] if raw else None
            elif name in PERF_OUTPUTS and raw:
                if record.server_perf is None:
                    record.server_perf = {}
                record.server_perf[name] = struct.unpack_from("<q", raw, 0)[0]
        if not self.count_server:
            tokens = 1 if text else 0
        final = response.parameters["triton_final_response"].bool_param
        if final:
            self.seen_text.pop(record.id, None)
        if not response.outputs and final:
            tokens, text = 0, None
        record.add_response(stamp, tokens, text, final, server_ns)
        return final

    async def _usable_stream(self) -> _Stream:
        index = next(self._next) % len(self.streams)
        stream = self.streams[index]
        if stream.broken is not None:
            try:
                assert self.stub is not None
                await asyncio.to_thread(self.stub.ServerReady, pb.ServerReadyRequest(), timeout=2)
            except grpc.RpcError as exc:
                raise TargetDown((exc.details() if isinstance(exc, grpc.Call) else None) or "server unreachable") from None
            stream.close()
            stream = self.streams[index] = _Stream(self, self.channels[index], asyncio.get_running_loop())
        return stream

    async def send(self, request: BenchRequest, record: RequestRecord) -> None:
        payload = self.build(request, record.id).SerializeToString()
        if self.tokenizer is not None and not self.count_server:
            record.texts = []
        record.output_tokens_source = self.info.output_tokens_source
        done = asyncio.get_running_loop().create_future()
        try:
            stream = await self._usable_stream()
        except TargetDown as exc:
            record.sent_ns = now_ns()
            record.error_kind, record.error_message = "connection", str(exc)
            raise
        stream.write(record, payload, done)
        await wait_done(done, record, self.request_timeout)
        if record.error_kind == "timeout":
            stream.pending.pop(record.id, None)
        if not record.sent_ns:  # never handed to the transport
            record.sent_ns = now_ns()

    async def close(self) -> None:
        streams, self.streams = self.streams, []
        if streams:
            await asyncio.to_thread(_close_all, streams)
        for channel in self.channels:
            channel.close()
        self.channels = []


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

    def parse_response(self, response, record: RequestRecord, stamp: int) -> bool:
        tokens = 0
        server_ns = None
        for output, raw in zip(response.outputs, response.raw_output_contents):
            if output.name == "output_ids":
                tokens = output.shape[-1] if output.shape else len(raw) // 4
            elif output.name == "send_time_ns" and raw:
                server_ns = struct.unpack_from("<q", raw, 0)[0]
            elif output.name in PERF_OUTPUTS and raw:
                if record.server_perf is None:
                    record.server_perf = {}
                record.server_perf[output.name] = struct.unpack_from("<q", raw, 0)[0]
        final = response.parameters["triton_final_response"].bool_param
        record.add_response(stamp, tokens, None, final, server_ns)
        return final
