"""A Dynamo worker serving our CPU engine: the engine loop of the Triton CPU model (engine_loop.py) behind Dynamo's
Python worker API. Run by the `dynamo` server kind (deploy/kinds/dynamo.py) as a script with Dynamo's own venv:

    .venv-dynamo/bin/python trtllm_forge/deploy/dynamo_worker.py --engine-modules DIR --engine-dir ENGINE
        --model-dir HF_DIR --model-name NAME --endpoint NAMESPACE.COMPONENT.generate [engine settings]

It imports neither trtllm_forge nor anything of our venv: Dynamo's runtime, the engine's libraries and the CPU
engine modules of `--engine-modules` (model_repo_templates/cpu/tensorrt_llm: engine_loop, its adapter, the GenAI
settings). The frontend tokenizes and detokenizes; a request arrives as token ids with Dynamo's `stop_conditions`
and `sampling_options`, and the worker streams `{"token_ids": [...]}` chunks, the last with its `finish_reason`
(a request it refuses raises Dynamo's InvalidArgument naming the field: HTTP 400: the frontend answers it, the worker lives on).
SIGTERM shuts the runtime down, which removes the worker's entries from the discovery store.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

LOG = logging.getLogger("trtllm_forge.dynamo_worker")
CANCEL_CHECK_S = 0.1  # how often a running request asks whether its client went away
ERROR_KEY = "forge_error"  # a chunk the engine loop hands the request's stream for an error (never sent as is)
BAD_REQUEST, SERVER_ERROR = 400, 500  # what the frontend answers for a refused request, an engine failure


@dataclass
class WorkerItem:
    """The one engine sequence of a Dynamo request (engine_loop.EngineItem)."""

    prompt: list[int]
    config: Any
    engine_id: int = -1
    handle: Any = None
    first_scheduled_ns: int = 0


@dataclass
class WorkerJob:
    """A Dynamo request inside the engine loop: its sequence, and where its chunks go (the request's event loop)."""

    item: WorkerItem
    chunks: asyncio.Queue[dict[str, Any] | None]
    loop: asyncio.AbstractEventLoop
    closed: bool = False
    tokens: int = 0
    items: list[WorkerItem] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.items = [self.item]

    def put(self, chunk: dict[str, Any] | None) -> None:
        self.loop.call_soon_threadsafe(self.chunks.put_nowait, chunk)


class RequestRefused(ValueError):
    """A request the engine cannot serve: the message names the field."""


class DynamoEngineServer:
    """The server side of engine_loop.EngineLoop for Dynamo: builds jobs from requests, streams their tokens."""

    def __init__(self, engine: Any, arrival_window_s: float) -> None:
        from engine_loop import EngineLoop
        from genai_settings import PENALTIES, sampling_problem, set_penalties, set_sampling

        self.engine = engine
        self._penalties, self._sampling_problem = PENALTIES, sampling_problem
        self._set_penalties, self._set_sampling = set_penalties, set_sampling
        self.loop = EngineLoop(engine, self, "dynamo-worker", arrival_window_s)

    # engine_loop.LoopServer
    def collect(self, job: WorkerJob, item: WorkerItem, now_ns: int, status: Any) -> None:
        from engine_loop import read_new

        tokens, _ = read_new(item)
        state = item.handle.get_status()
        if tokens and not job.closed:
            job.tokens += len(tokens)
            job.put({"token_ids": tokens})
        if state == status.IGNORED:
            self.refuse(job, "prompt: the request does not fit in the KV cache; shorten it or raise runtime.max_tokens_in_paged_kv_cache")
        elif state in (status.FINISHED, status.STOP, status.CANCEL):
            self.loop.active.pop(item.engine_id, None)
            if not job.closed:
                job.closed = True
                reason = "length" if job.tokens >= item.config.max_new_tokens else "stop"
                job.put({"token_ids": [], "finish_reason": reason})
                job.put(None)

    def fail(self, job: WorkerJob, message: str) -> None:
        self._end_with_error(job, SERVER_ERROR, message)

    def refuse(self, job: WorkerJob, message: str) -> None:
        """End the job with a client error (HTTP 400 at the frontend): the message names the field."""
        self._end_with_error(job, BAD_REQUEST, message)

    def _end_with_error(self, job: WorkerJob, code: int, message: str) -> None:
        if job.item.engine_id in self.loop.active:
            with contextlib.suppress(Exception):
                job.item.handle.stop()
            self.loop.active.pop(job.item.engine_id, None)
        if not job.closed:
            job.closed = True
            job.put({ERROR_KEY: message, "code": code})
            job.put(None)

    def after_step(self) -> None:
        pass

    def log_error(self, message: str) -> None:
        LOG.error(message)

    def cancel(self, job: WorkerJob) -> None:
        """On the loop thread: the client went away; stop the sequence (nothing more is sent)."""
        if job.closed:
            return
        job.closed = True
        if job.item.engine_id in self.loop.active:
            job.item.handle.stop()
            self.loop.active.pop(job.item.engine_id, None)
        job.put(None)

    def generation_config(self, request: dict[str, Any]) -> tuple[list[int], Any]:
        """(prompt, GenerationConfig) of a Dynamo request; RequestRefused names the field it cannot serve."""
        engine = self.engine
        prompt = [int(t) for t in request.get("token_ids") or []]
        if not prompt:
            raise RequestRefused("prompt: empty; send at least one token")
        if len(prompt) > engine.max_input_len:
            raise RequestRefused(f"prompt: {len(prompt)} tokens, more than the engine's max_input_len {engine.max_input_len}; shorten it")
        if min(prompt) < 0 or max(prompt) >= engine.vocab_size:
            raise RequestRefused(f"prompt: token ids must be in [0, {engine.vocab_size})")
        stop = request.get("stop_conditions") or {}
        sampling = request.get("sampling_options") or {}
        room = engine.max_seq_len - len(prompt)
        max_tokens = stop.get("max_tokens")
        max_new = room if max_tokens is None else min(int(max_tokens), room)
        if max_new <= 0:
            raise RequestRefused(f"max_tokens: {max_tokens}; must be >= 1 and leave the prompt room within {engine.max_seq_len} tokens")
        config = engine.adapter.GenerationConfig()
        config.max_new_tokens = max_new
        stop_ids = set(stop.get("stop_token_ids_hidden") or [])
        if stop.get("ignore_eos"):
            config.ignore_eos = True
        else:
            stop_ids.update(engine.default_eos)
            if engine.default_eos:
                config.eos_token_id = engine.default_eos[0]
        config.stop_token_ids = stop_ids
        if stop.get("min_tokens"):
            config.min_new_tokens = int(stop["min_tokens"])
        temperature = sampling.get("temperature")
        temperature = 1.0 if temperature is None else float(temperature)
        top_k = int(sampling.get("top_k") or 0)
        top_p = sampling.get("top_p")
        if temperature > 0.0 and top_k != 1:
            self._set_sampling(config, temperature, max(top_k, 0), 1.0 if top_p is None else float(top_p), sampling.get("seed"))
        else:
            config.do_sample = False
        self._set_penalties(config, {name: sampling.get(name) for name in self._penalties})
        if engine.num_assistant_tokens:
            config.num_assistant_tokens = engine.num_assistant_tokens
        problem = self._sampling_problem(config)
        if problem:
            raise RequestRefused(problem)
        return prompt, config

    async def generate(self, request: dict[str, Any], context: Any) -> AsyncIterator[dict[str, Any]]:
        try:
            prompt, config = self.generation_config(request)
        except (RequestRefused, TypeError, ValueError) as exc:
            raise _http_error(BAD_REQUEST, str(exc)) from None
        job = WorkerJob(WorkerItem(prompt, config), asyncio.Queue(), asyncio.get_running_loop())
        self.loop.incoming.put(job)
        try:
            while True:
                try:
                    chunk = await asyncio.wait_for(job.chunks.get(), CANCEL_CHECK_S)
                except TimeoutError:
                    if context is not None and context.is_stopped():
                        self.loop.incoming.put(lambda: self.cancel(job))
                        return
                    continue
                if chunk is None:
                    return
                if ERROR_KEY in chunk:
                    raise _http_error(int(chunk["code"]), str(chunk[ERROR_KEY]))
                yield chunk
        finally:
            if not job.closed:  # the frontend dropped the stream: stop the sequence
                self.loop.incoming.put(lambda: self.cancel(job))


def _http_error(code: int, message: str) -> Exception:
    """What the frontend answers with `code`: a 400 as Dynamo's InvalidArgument, whose message reaches the client
    (a plain HttpError's message is replaced by "Bad Request" at the frontend), else an HttpError."""
    from dynamo.llm.exceptions import HttpError, InvalidArgument

    return InvalidArgument(message) if code == BAD_REQUEST else HttpError(code, message)


async def serve(args: argparse.Namespace) -> None:
    from dynamo.llm import ModelInput, ModelRuntimeConfig, ModelType, WorkerType, register_model
    from dynamo.runtime import DistributedRuntime
    from engine_loop import load_engine

    engine = load_engine(
        args.engine_dir,
        kv_tokens=args.kv_tokens,
        prefix_caching=args.prefix_caching,
        split_fuse=args.split_fuse,
        warn=LOG.warning,
    )
    LOG.info("%s", engine.description)
    server = DynamoEngineServer(engine, args.arrival_window_ms / 1000.0)
    server.loop.start()

    runtime = DistributedRuntime(asyncio.get_running_loop(), "file", "tcp")
    stopping = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stopping.set)
    endpoint = runtime.endpoint(args.endpoint)
    runtime_config = ModelRuntimeConfig()
    runtime_config.max_num_seqs = engine.max_batch_size
    runtime_config.context_length = engine.max_seq_len
    await register_model(
        ModelInput.Tokens,
        ModelType.Completions | ModelType.Chat,
        endpoint,
        args.model_dir,
        args.model_name,
        worker_type=WorkerType.Aggregated,
        kv_cache_block_size=args.kv_block_size,
        runtime_config=runtime_config,
    )
    serving = asyncio.ensure_future(endpoint.serve_endpoint(server.generate))
    LOG.info("serving %s on %s", args.model_name, args.endpoint)
    stop_wait = asyncio.ensure_future(stopping.wait())
    await asyncio.wait([serving, stop_wait], return_when=asyncio.FIRST_COMPLETED)
    LOG.info("shutting down")
    runtime.shutdown()  # removes this worker's instance and model entries from the discovery store
    with contextlib.suppress(Exception):
        await asyncio.wait_for(serving, 10)
    server.loop.stop(timeout_s=10)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--engine-modules", required=True, help="model_repo_templates/cpu/tensorrt_llm (engine_loop.py and its siblings)")
    parser.add_argument("--engine-dir", required=True)
    parser.add_argument("--model-dir", required=True, help="the HF directory the frontend reads (config.json, tokenizer)")
    parser.add_argument("--model-name", required=True)
    parser.add_argument("--endpoint", required=True, help="namespace.component.generate")
    parser.add_argument("--kv-tokens", type=int, default=None)
    parser.add_argument("--kv-block-size", type=int, default=32)
    parser.add_argument("--prefix-caching", action="store_true")
    parser.add_argument("--split-fuse", action="store_true")
    parser.add_argument("--arrival-window-ms", type=float, default=0.0)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    sys.path.insert(0, args.engine_modules)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    threading.current_thread().name = "dynamo-worker"
    asyncio.run(serve(args))


if __name__ == "__main__":
    main()
