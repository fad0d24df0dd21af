"""`trtllm-serve` for the CPU stand-in (NOT TensorRT-LLM): the same argv as `trtllm-serve MODEL --backend pytorch
--host H --port P --tp_size 1 --pp_size 1 ... --extra_llm_api_options YAML`, serving the stand-in's LLM behind
the OpenAI-compatible endpoints trtllm-serve offers: /v1/completions and /v1/chat/completions (streamed as
server-sent events or not), /v1/models, /health, /version and /metrics (a JSON list like trtllm-serve's, here
holding the stand-in engine's own counters).

    python -m trtllm_forge.llmapi_cpu.serve <OpenVINO IR dir> --host 127.0.0.1 --port 8000 --extra_llm_api_options x.yaml
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import uuid
from typing import Any

from aiohttp import web

from trtllm_forge.llmapi_cpu import LLM, RequestError, RequestOutput, SamplingParams

# trtllm-serve's own flags that become LLM() arguments (NVIDIA/TensorRT-LLM:tensorrt_llm/commands/serve.py).
FLAG_TO_ARG = {
    "tp_size": "tensor_parallel_size",
    "pp_size": "pipeline_parallel_size",
    "ep_size": "moe_expert_parallel_size",
    "max_batch_size": "max_batch_size",
    "max_num_tokens": "max_num_tokens",
    "max_seq_len": "max_seq_len",
    "max_beam_width": "max_beam_width",
}
SAMPLING_FIELDS = (
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "stop",
    "ignore_eos",
    "min_tokens",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="trtllm-serve (CPU stand-in)")
    parser.add_argument("model")
    parser.add_argument("--backend", default="pytorch", choices=["pytorch"])
    parser.add_argument("--host", default="localhost")
    parser.add_argument("--port", type=int, default=8000)
    for flag in FLAG_TO_ARG:
        parser.add_argument(f"--{flag}", type=int, default=None)
    parser.add_argument("--kv_cache_free_gpu_memory_fraction", type=float, default=None)  # no GPU: accepted, unused
    parser.add_argument("--extra_llm_api_options", "--config", dest="extra", default=None)
    parser.add_argument("--tokenizer", default=None)
    parser.add_argument("--served_model_name", default=None)
    return parser.parse_args(argv)


def llm_args(args: argparse.Namespace) -> dict:
    import yaml

    kwargs = {arg: getattr(args, flag) for flag, arg in FLAG_TO_ARG.items() if getattr(args, flag) is not None}
    if args.tokenizer:
        kwargs["tokenizer"] = args.tokenizer
    if args.extra:
        with open(args.extra, encoding="utf-8") as handle:
            extra = yaml.safe_load(handle) or {}
        extra.pop("model", None)
        kwargs.update(extra)
    kwargs.pop("backend", None)
    return kwargs


class OpenAIServer:
    def __init__(self, llm: LLM, model_name: str):
        self.llm = llm
        self.model_name = model_name
        self.started = int(time.time())
        self.app = web.Application()
        self.app.add_routes(
            [
                web.get("/health", self.health),
                web.get("/version", self.version),
                web.get("/v1/models", self.models),
                web.get("/metrics", self.metrics),
                web.post("/v1/completions", self.completions),
                web.post("/v1/chat/completions", self.chat),
            ]
        )

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": "cpu-stand-in (not TensorRT-LLM)"})

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "object": "list",
                "data": [{"id": self.model_name, "object": "model", "created": self.started, "owned_by": "trtllm-forge-cpu-stand-in"}],
            }
        )

    async def metrics(self, request: web.Request) -> web.Response:
        return web.json_response([{"timestamp": time.strftime("%m-%d-%Y %H:%M:%S"), **self.llm.stats}])

    @staticmethod
    def _error(status: int, message: str) -> web.Response:
        return web.json_response({"object": "error", "message": message, "type": "BadRequestError", "code": status}, status=status)

    def _sampling(self, body: dict) -> SamplingParams:
        kwargs = {k: body[k] for k in SAMPLING_FIELDS if body.get(k) is not None}
        kwargs.setdefault("max_tokens", 16)  # OpenAI's completions default
        if body.get("n", 1) != 1:
            raise RequestError("n must be 1 on the CPU stand-in")
        return SamplingParams(**kwargs)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def _generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        try:
            body = await request.json()
        except json.JSONDecodeError:
            return self._error(400, "the body is not JSON")
        try:
            if chat:
                messages = body.get("messages") or []
                prompt = self.llm.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            else:
                prompt = body.get("prompt")
                prompt = prompt[0] if isinstance(prompt, list) and prompt and isinstance(prompt[0], str) else prompt
            if not prompt:
                raise RequestError("prompt (or messages) is required")
            params = self._sampling(body)
            stream = bool(body.get("stream"))
            result = self.llm.generate_async(prompt, params, streaming=stream)
        except (RequestError, ValueError, TypeError) as exc:
            return self._error(400, str(exc))
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        kind = "chat.completion" if chat else "text_completion"
        if not stream:
            try:
                done = await result
            except Exception as exc:
                return self._error(400, str(exc))
            out = done.outputs[0]
            choice: dict[str, Any] = {"index": 0, "finish_reason": out.finish_reason, "stop_reason": out.stop_reason}
            choice.update({"message": {"role": "assistant", "content": out.text}} if chat else {"text": out.text})
            return web.json_response(
                {
                    "id": rid,
                    "object": kind,
                    "created": int(time.time()),
                    "model": self.model_name,
                    "choices": [choice],
                    "usage": self._usage(done),
                }
            )
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        kind += ".chunk" if chat else ""
        last = None
        try:
            if chat:
                await self._event(response, rid, kind, {"index": 0, "delta": {"role": "assistant"}, "finish_reason": None})
            async for last in result:
                out = last.outputs[0]
                piece = out.text_diff
                delta = {"delta": {"content": piece}} if chat else {"text": piece}
                if piece or out.finish_reason:
                    await self._event(response, rid, kind, {"index": 0, **delta, "finish_reason": out.finish_reason})
            if (body.get("stream_options") or {}).get("include_usage") and last is not None:
                await self._send(
                    response,
                    {
                        "id": rid,
                        "object": kind,
                        "created": int(time.time()),
                        "model": self.model_name,
                        "choices": [],
                        "usage": self._usage(last),
                    },
                )
            await response.write(b"data: [DONE]\n\n")
        except (ConnectionResetError, asyncio.CancelledError):
            result.abort()  # the client went away: stop generating for it
            raise
        except Exception as exc:
            await self._send(response, {"object": "error", "message": str(exc)})
        return response

    async def _event(self, response: web.StreamResponse, rid: str, kind: str, choice: dict) -> None:
        await self._send(response, {"id": rid, "object": kind, "created": int(time.time()), "model": self.model_name, "choices": [choice]})

    @staticmethod
    async def _send(response: web.StreamResponse, data: dict) -> None:
        await response.write(b"data: " + json.dumps(data).encode() + b"\n\n")

    @staticmethod
    def _usage(result: RequestOutput) -> dict:
        prompt, completion = len(result.prompt_token_ids), len(result.outputs[0].token_ids)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    llm = LLM(model=args.model, **llm_args(args))
    server = OpenAIServer(llm, args.served_model_name or args.model)
    print(f"trtllm-serve CPU stand-in (not TensorRT-LLM): {llm.warm_up}", flush=True)
    print(f"trtllm-serve CPU stand-in (not TensorRT-LLM) serving {args.model} on http://{args.host}:{args.port}", flush=True)
    try:
        web.run_app(server.app, host=args.host, port=args.port, print=None, handle_signals=True)
    finally:
        llm.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
