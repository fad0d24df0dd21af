"""Triton gRPC streaming targets: the text contract of the ensemble / tensorrt_llm_bls model, and token ids
straight to the tensorrt_llm model. Uses tritonclient's protobuf messages over grpc's threaded (sync) API,
skipping its InferResult wrapper. Each request is its own ModelStreamInfer call, carried by a client thread
(a lane) that polls the call itself, stamps each response as it hands it over and decodes the responses only
when the call has ended (see _Lane)."""

from __future__ import annotations

import asyncio
import collections
import queue
import struct
import sys
import threading
from dataclasses import dataclass
from typing import Any

import grpc
import grpc.experimental
from google.protobuf.json_format import MessageToDict
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from trtllm_forge.bench.records import RequestRecord
from trtllm_forge.bench.target import UNREACHABLE_END_ID, Target, TargetDown, now_ns, output_length_plan, wait_done
from trtllm_forge.bench.workload import BenchRequest
from trtllm_forge.errors import StepError

PERF_OUTPUTS = ("arrival_time_ns", "first_scheduled_time_ns", "first_token_time_ns", "last_token_time_ns")
_CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 64 << 20),
    ("grpc.max_send_message_length", 64 << 20),
    ("grpc.use_local_subchannel_pool", 1),  # a connection per channel, not one shared by equal channels
    (grpc.experimental.ChannelOptions.SingleThreadedUnaryStream, 1),  # the calling thread polls its call (see _Lane)
]
_STREAM_METHOD = "/inference.GRPCInferenceService/ModelStreamInfer"
# While the target is open, a thread that wants the GIL gets it after at most this long (Python's default is
# 5 ms). A lane woken by a response needs the GIL before it can stamp; the first response of a call comes
# with the call's headers, handled as a separate completion, so it needs the GIL twice. Under load the
# default let another lane's Python run 5 ms ahead of a stamp (TTFT error vs the model's stamps at
# concurrency 16: +2.4% to +5.7% with 5 ms, +1.8% to +2.7% with 0.2 ms, interleaved runs, load average 11-13).
GIL_SWITCH_S = 0.0002
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
    done: asyncio.Future


def _stamp_sent(item: _Outgoing) -> bytes:
    """grpc's request serializer: called in the lane's thread right before the call starts; the request was
    serialized before, so only the stamp is taken here."""
    item.record.sent_ns = now_ns()
    return item.payload


def _stamp_received(raw: bytes) -> tuple[int, bytes]:
    """grpc's response deserializer: the receive stamp, taken first, before anything is decoded."""
    return now_ns(), raw


def _resolve(done: asyncio.Future) -> None:
    if not done.done():
        done.set_result(None)


def _close_all(lanes: list["_Lane"]) -> None:
    for lane in lanes:
        lane.close()


_DECODE = pb.ModelStreamInferResponse.FromString


class _Lane:
    """One client thread that carries one request at a time as its own ModelStreamInfer call (one request,
    then the client half-closes; Triton ends the call after the final response).

    The call runs in grpc's single-threaded unary-stream mode: this thread polls the call's completion queue
    itself, so a response is stamped by the thread that asked for it, with one thread wake-up, and no other
    client thread has to run first. (grpc's bidirectional streams hand every message from the channel's
    completion thread to the reading thread: two wake-ups per message, and a message is only asked for when
    the reader is back; under a response flood that doubled our stamp lag and cost a third more CPU per
    response than perf_analyzer.) Between two responses the thread only stamps and keeps the raw bytes; they
    are decoded when the call has ended, so decoding never delays a stamp."""

    def __init__(
        self, target: "TritonGrpcTarget", channel: grpc.Channel, loop: asyncio.AbstractEventLoop, free: "collections.deque[_Lane]"
    ):
        self.target = target
        self.loop = loop
        self.free = free
        self.call = channel.unary_stream(_STREAM_METHOD, request_serializer=_stamp_sent, response_deserializer=_stamp_received)
        self.inbox: queue.SimpleQueue[_Outgoing | None] = queue.SimpleQueue()
        self.running: Any = None  # the call in flight, for cancel()
        self.current: RequestRecord | None = None
        self.broken: BaseException | None = None
        self.thread = threading.Thread(target=self._serve, name="bench-grpc-lane", daemon=True)
        self.thread.start()

    def submit(self, record: RequestRecord, payload: bytes, done: asyncio.Future) -> None:
        self.inbox.put(_Outgoing(record, payload, done))

    def _serve(self) -> None:
        while (item := self.inbox.get()) is not None:
            self.current = item.record
            try:
                self._carry(item)
            finally:
                self.current = None
                self.free.append(self)  # free before the loop learns the request ended: the next one may come here
                try:
                    self.loop.call_soon_threadsafe(_resolve, item.done)
                except RuntimeError:  # the event loop closed under a lane that was never closed
                    return

    def _carry(self, item: _Outgoing) -> None:
        record = item.record
        stamps: list[int] = []
        raws: list[bytes] = []
        record.recv_ns = stamps  # filled as responses come: the runner's stall watchdog reads the last stamp
        try:
            self.running = call = self.call(item)
            for stamp, raw in call:
                stamps.append(stamp)
                raws.append(raw)
            self.broken = None
        except grpc.RpcError as exc:
            if record.error_kind is None:
                record.error_kind, record.error_message = _rpc_error(exc)
            if isinstance(exc, grpc.Call) and exc.code() == grpc.StatusCode.UNAVAILABLE:
                self.broken = exc
        finally:
            self.running = None
            item.payload = b""
        self.decode(record, raws)

    def decode(self, record: RequestRecord, raws: list[bytes]) -> None:
        """After the call: parse the responses whose stamps are in `record.recv_ns`, in arrival order; stamps
        after the final response (or a server error) are dropped."""
        parse = self.target.parse_response
        used = 0
        for raw in raws:
            message = _DECODE(raw)
            if message.error_message:
                if record.error_kind is None:
                    record.error_kind, record.error_message = "server_error", message.error_message
                break
            used += 1
            if parse(message.infer_response, record):
                break
        else:
            if record.error_kind is None:
                record.error_kind, record.error_message = "connection", "the call ended without a final response"
        del record.recv_ns[used:]

    def cancel(self, record: RequestRecord) -> None:
        """End `record`'s call (its timeout passed); the lane then takes the next request."""
        call = self.running
        if call is not None and self.current is record:
            call.cancel()

    def close(self) -> None:
        self.inbox.put(None)
        call = self.running
        if call is not None:
            call.cancel()
        self.thread.join(timeout=5)


def _rpc_error(exc: grpc.RpcError) -> tuple[str, str]:
    if isinstance(exc, grpc.Call):
        code = exc.code()
        kind = "connection" if code == grpc.StatusCode.UNAVAILABLE else f"grpc_{code.name.lower()}"
        return kind, exc.details() or code.name
    return "connection", str(exc) or type(exc).__name__


class TritonGrpcTarget(Target):
    """Text in, text out: `text_input`, `max_tokens`, `stream`, sampling inputs → `text_output`."""

    kind = "triton-grpc"

    def __init__(self, *args, streams: int = 1, **kwargs):
        super().__init__(*args, **kwargs)
        self.n_streams = max(1, streams)
        self.channels: list[grpc.Channel] = []
        self.stub: pb_grpc.GRPCInferenceServiceStub | None = None
        self.lanes: list[_Lane] = []
        self.free: collections.deque[_Lane] = collections.deque()
        self.switch_interval: float | None = None  # the process's GIL switch interval before open()
        self.inputs: dict[str, dict] = {}
        self.outputs: set[str] = set()
        self.batched = False

    async def open(self) -> None:
        # One channel (own TCP connection) per lane, as perf_analyzer has one per concurrency slot.
        self.channels = [grpc.insecure_channel(self.url, options=_CHANNEL_OPTIONS) for _ in range(self.n_streams)]
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
        self.switch_interval = sys.getswitchinterval()
        sys.setswitchinterval(min(self.switch_interval, GIL_SWITCH_S))
        self.lanes = [_Lane(self, channel, loop, self.free) for channel in self.channels]
        self.free.extend(self.lanes)
        self.info.notes.append(f"{self.n_streams} gRPC connection(s) with a client thread each; one ModelStreamInfer call per request")

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

    def parse_response(self, response, record: RequestRecord) -> bool:
        """Record what one response carried (its stamp is already in `record.recv_ns`); return whether it was the final one."""
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
        record.add_content(tokens, text, final, server_ns)
        return final

    async def _free_lane(self) -> _Lane:
        """A lane with no request in flight: one is free per request in flight up to --streams; past that a new
        lane (thread) shares a connection round robin. After a connection failure, the server must answer first."""
        try:
            lane = self.free.popleft()
        except IndexError:
            lane = _Lane(self, self.channels[len(self.lanes) % len(self.channels)], asyncio.get_running_loop(), self.free)
            self.lanes.append(lane)
        if lane.broken is not None:
            try:
                assert self.stub is not None
                await asyncio.to_thread(self.stub.ServerReady, pb.ServerReadyRequest(), timeout=2)
            except grpc.RpcError as exc:
                self.free.append(lane)
                raise TargetDown((exc.details() if isinstance(exc, grpc.Call) else None) or "server unreachable") from None
            lane.broken = None
        return lane

    async def send(self, request: BenchRequest, record: RequestRecord) -> None:
        payload = self.build(request, record.id).SerializeToString()
        if self.tokenizer is not None and not self.count_server:
            record.texts = []
        record.output_tokens_source = self.info.output_tokens_source
        done = asyncio.get_running_loop().create_future()
        try:
            lane = await self._free_lane()
        except TargetDown as exc:
            record.sent_ns = now_ns()
            record.error_kind, record.error_message = "connection", str(exc)
            raise
        lane.submit(record, payload, done)
        await wait_done(done, record, self.request_timeout)
        if record.error_kind == "timeout":
            lane.cancel(record)
        if not record.sent_ns:  # never handed to the transport
            record.sent_ns = now_ns()

    async def close(self) -> None:
        lanes, self.lanes = self.lanes, []
        self.free.clear()
        if lanes:
            await asyncio.to_thread(_close_all, lanes)
        for channel in self.channels:
            channel.close()
        self.channels = []
        if self.switch_interval is not None:
            sys.setswitchinterval(self.switch_interval)
            self.switch_interval = None


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

    def parse_response(self, response, record: RequestRecord) -> bool:
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
        record.add_content(tokens, None, final, server_ns)
        return final
