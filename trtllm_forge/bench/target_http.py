"""HTTP streaming targets (server-sent events over aiohttp): Triton's `generate_stream` and an
OpenAI-compatible `/v1/completions` or `/v1/chat/completions` endpoint (vLLM, trtllm-serve, ...).

Each `data:` line is stamped when the client reads it; several events arriving in one network read get
nearly equal stamps (see the zero-gap self-check)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp

from trtllm_forge.bench.records import RequestRecord
from trtllm_forge.bench.target import UNREACHABLE_END_ID, Target, TargetDown, now_ns, output_length_plan
from trtllm_forge.bench.workload import BenchRequest
from trtllm_forge.errors import StepError

RETRIES_BEFORE_RESPONSE = 1  # resends of a request whose connection failed before any response byte


class _SseTarget(Target):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.url = self.url.rstrip("/")
        if not self.url.startswith(("http://", "https://")):
            self.url = "http://" + self.url
        self.session: aiohttp.ClientSession | None = None
        self.retry_session: aiohttp.ClientSession | None = None

    async def _open_session(self) -> None:
        connector = aiohttp.TCPConnector(limit=0, force_close=False)
        self.session = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
            read_bufsize=1 << 20,  # large reads: a small buffer throttles long streams (vLLM #39963)
        )

    async def close(self) -> None:
        for session in (self.session, self.retry_session):
            if session is not None:
                await session.close()

    def payload(self, request: BenchRequest) -> dict:
        raise NotImplementedError

    def endpoint(self) -> str:
        raise NotImplementedError

    def parse_event(self, data: dict, record: RequestRecord, stamp: int) -> None:
        raise NotImplementedError

    def finish(self, record: RequestRecord) -> None:
        pass

    def keeps_texts(self) -> bool:
        return self.tokenizer is not None

    async def send(self, request: BenchRequest, record: RequestRecord) -> None:
        if self.keeps_texts():
            record.texts = []
        record.output_tokens_source = self.info.output_tokens_source
        body = json.dumps(self.payload(request))
        try:
            async with asyncio.timeout(self.request_timeout):
                for attempt in range(1 + RETRIES_BEFORE_RESPONSE):
                    record.sent_ns = now_ns()
                    try:
                        await self._post(body, record, fresh=attempt > 0)
                        break
                    except _NotAccepted as exc:
                        # The pooled keep-alive connection was already closed by the server: nothing of this
                        # request reached it. Send it again on a new connection; a retry, not a failure.
                        if attempt == RETRIES_BEFORE_RESPONSE:
                            raise exc.cause from None
                        record.retries += 1
            self.finish(record)
        except TimeoutError:
            record.error_kind, record.error_message = "timeout", f"no end of stream within {self.request_timeout:g} s"
        except aiohttp.ClientConnectorError as exc:
            record.error_kind, record.error_message = "connection", str(exc)
            raise TargetDown(str(exc)) from None
        except (aiohttp.ClientError, ConnectionError, json.JSONDecodeError) as exc:
            record.error_kind, record.error_message = "connection", f"{type(exc).__name__}: {exc}"[:500]

    async def _post(self, body: str, record: RequestRecord, fresh: bool) -> None:
        """One attempt. Raises _NotAccepted when the connection failed before any response byte arrived."""
        session = await self._fresh_session() if fresh else self.session
        assert session is not None  # open() made it
        try:
            response = await session.post(self.endpoint(), data=body, headers={"Content-Type": "application/json"})
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
            if isinstance(exc, aiohttp.ClientConnectorError):
                raise
            raise _NotAccepted(exc) from None
        async with response:
            if response.status != 200:
                text = (await response.text())[:200]
                record.error_kind, record.error_message = f"http_{response.status}", text.strip() or response.reason
                return
            async for line in response.content:
                stamp = now_ns()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    record.add_response(stamp, 0, "", final=True)
                    continue
                event = json.loads(data)
                if "error" in event:
                    record.error_kind, record.error_message = "server_error", str(event["error"])[:500]
                    return
                self.parse_event(event, record, stamp)

    async def _fresh_session(self) -> aiohttp.ClientSession:
        """A session whose every request opens a new connection (for retries)."""
        if self.retry_session is None:
            self.retry_session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, force_close=True),
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
                read_bufsize=1 << 20,
            )
        return self.retry_session


class _NotAccepted(Exception):
    def __init__(self, cause: Exception):
        super().__init__(str(cause))
        self.cause = cause


class TritonHttpTarget(_SseTarget):
    """`POST /v2/models/<model>/generate_stream`: JSON keys are the ensemble's input names."""

    kind = "triton-http"

    async def open(self) -> None:
        await self._open_session()
        assert self.session is not None
        try:
            async with self.session.get(f"{self.url}/v2/models/{self.model}/config") as response:
                if response.status != 200:
                    raise StepError(
                        "--model", f"{self.model!r} not found at {self.url} (HTTP {response.status})", "check --url and --model"
                    )
                config = await response.json()
            async with self.session.get(f"{self.url}/v2") as response:
                self.info.server_version = (await response.json()).get("version")
        except aiohttp.ClientError as exc:
            await self.close()
            raise StepError("--url", f"cannot reach {self.url}: {exc}", "check --url and that the server is up") from None
        self.inputs = {i["name"] for i in config.get("input", [])}
        outputs = {o["name"] for o in config.get("output", [])}
        if not {"text_input", "max_tokens"} <= self.inputs:
            await self.close()
            raise StepError("--model", f"{self.model!r} does not take text_input/max_tokens", "use the ensemble or tensorrt_llm_bls model")
        self.length_input, self.end_id, self.info.forced_output_len = output_length_plan(self.inputs, self.force_output_len)
        self.count_server = "return_num_output_tokens" in self.inputs and "num_output_tokens" in outputs
        self.perf = "return_perf_metrics" in self.inputs and "first_token_time_ns" in outputs
        self.info.output_tokens_source = "server_count" if self.count_server else ("client_tokenizer" if self.tokenizer else "responses")
        self.info.notes.append(
            "streams with fewer token-bearing events than requested are errors of kind short_stream "
            "(Triton 2.51 can end an HTTP stream early under load)"
        )

    def keeps_texts(self) -> bool:
        return self.tokenizer is not None and not self.count_server

    def endpoint(self) -> str:
        return f"{self.url}/v2/models/{self.model}/generate_stream"

    def payload(self, request: BenchRequest) -> dict:
        body = {"text_input": request.prompt, "max_tokens": request.output_tokens}
        for name, value in (("stream", True), ("exclude_input_in_output", True)):
            if name in self.inputs:
                body[name] = value
        if self.count_server:
            body["return_num_output_tokens"] = True
        if self.perf:
            body["return_perf_metrics"] = True
        if self.length_input:
            body[self.length_input] = request.output_tokens
        if self.end_id:
            body["end_id"] = UNREACHABLE_END_ID
        return body

    def request_inputs(self, request: BenchRequest) -> list[tuple[str, str, list]]:
        """The JSON fields one request sends (for `bench --tool aiperf`), as (name, "", [value])."""
        return [(name, "", [value]) for name, value in self.payload(request).items()]

    def parse_event(self, data: dict, record: RequestRecord, stamp: int) -> None:
        text = data.get("text_output")
        if isinstance(text, list):
            text = text[0] if text else ""
        if self.count_server:
            count = data.get("num_output_tokens", 0)
            tokens = int(count[0] if isinstance(count, list) else count)
        else:
            tokens = 1 if text else 0
        for name in ("arrival_time_ns", "first_scheduled_time_ns", "first_token_time_ns", "last_token_time_ns"):
            if name in data:
                value = data[name]
                record.server_perf = {**(record.server_perf or {}), name: int(value[0] if isinstance(value, list) else value)}
        server_ns = data.get("send_time_ns")
        if isinstance(server_ns, list):
            server_ns = server_ns[0]
        record.add_response(stamp, tokens, text, server_ns=server_ns)

    def finish(self, record: RequestRecord) -> None:
        # SSE has no final flag: the end of the HTTP response ends the request.
        if record.final:
            record.final[-1] = True
        if self.info.forced_output_len and self.count_server and record.output_tokens < record.requested_output_tokens:
            record.error_kind = "short_stream"
            record.error_message = f"{record.output_tokens} of {record.requested_output_tokens} tokens before the stream ended"


class OpenAITarget(_SseTarget):
    """OpenAI-compatible streaming completions or chat completions."""

    kind = "openai"

    def __init__(self, *args: Any, endpoint: str = "completions", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.chat = endpoint == "chat"
        if self.url.endswith("/v1"):
            self.url = self.url[:-3]

    async def open(self) -> None:
        await self._open_session()
        assert self.session is not None
        try:
            async with self.session.get(f"{self.url}/v1/models") as response:
                if response.status == 200:
                    served = [m.get("id") for m in (await response.json()).get("data", [])]
                    if served and self.model not in served:
                        self.info.notes.append(f"model {self.model!r} not in /v1/models ({', '.join(map(str, served))})")
        except aiohttp.ClientError as exc:
            await self.close()
            raise StepError("--url", f"cannot reach {self.url}: {exc}", "check --url and that the server is up") from None
        if self.force_output_len:
            self.info.forced_output_len = "ignore_eos=true, min_tokens=max_tokens"
        self.info.output_tokens_source = "client_tokenizer" if self.tokenizer else "responses"
        self.info.notes.append(
            "usage.completion_tokens, when the server sends it, corrects the chunk count (excess goes to the last chunk)"
        )

    def endpoint(self) -> str:
        return f"{self.url}/v1/chat/completions" if self.chat else f"{self.url}/v1/completions"

    def payload(self, request: BenchRequest) -> dict:
        body = {
            "model": self.model,
            "max_tokens": request.output_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
            "temperature": 0.0,
        }
        if self.chat:
            body["messages"] = [{"role": "user", "content": request.prompt}]
        else:
            body["prompt"] = request.prompt
        if self.force_output_len:
            body["ignore_eos"] = True
            body["min_tokens"] = request.output_tokens
        return body

    def parse_event(self, data: dict, record: RequestRecord, stamp: int) -> None:
        usage = data.get("usage")
        if usage and usage.get("completion_tokens") is not None:
            record.usage_tokens = int(usage["completion_tokens"])
        choices = data.get("choices") or []
        if not choices:
            return
        choice = choices[0]
        text = choice.get("delta", {}).get("content") if self.chat else choice.get("text")
        record.add_response(stamp, 1 if text else 0, text)

    def finish(self, record: RequestRecord) -> None:
        if record.final:
            record.final[-1] = True
        usage = record.usage_tokens
        if usage is None or self.tokenizer is not None:
            return
        chunks = record.output_tokens
        token_indexes = [i for i, n in enumerate(record.tokens) if n > 0]
        if token_indexes and usage != chunks:
            record.tokens[token_indexes[-1]] += usage - chunks
        record.output_tokens_source = "server_usage"
