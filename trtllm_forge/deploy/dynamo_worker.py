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

With `--publish-kv-events` (prefix caching on, the KV router using events) the worker tells the router what its
engine's prefix cache holds, the way Dynamo's own workers do (KvEventPublisher): "stored" for the full blocks of a
prompt once its prefill ran, and of prompt + output at its end (OpenVINO GenAI keeps both for reuse); "removed" for
the blocks its own LRU record of the pool drops. OpenVINO GenAI reports neither its cache hits nor its evictions, so
the removals are this worker's estimate (the pool's block count, least recently used first; the engine may evict
earlier while running sequences hold blocks), and no `cached_tokens` is reported in the usage.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import logging
import queue
import signal
import sys
import threading
from array import array
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
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
    output: list[int] = field(default_factory=list)


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


def block_hashes(tokens: list[int], block_size: int) -> list[int]:
    """One id per full block of `tokens`, chained (a block's id depends on every token before it, as the engine's
    prefix cache keys it): signed 64-bit, as Dynamo's KV events carry them."""
    hashes: list[int] = []
    parent = b""
    for start in range(0, len(tokens) - len(tokens) % block_size, block_size):
        digest = hashlib.blake2b(parent + array("q", tokens[start : start + block_size]).tobytes(), digest_size=8).digest()
        hashes.append(int.from_bytes(digest, "little", signed=True))
        parent = digest
    return hashes


class KvCacheRecord:
    """What this worker tells the KV router about its engine's prefix cache: the blocks it stored, least recently
    used first, at most `capacity` (the engine's pool); the rest are published as removed. Its methods only queue:
    the publishing runs on its own thread, off the engine loop."""

    def __init__(
        self,
        publish_stored: Callable[..., None],
        publish_removed: Callable[[list[int]], None],
        block_size: int,
        capacity: int,
    ) -> None:
        self.block_size, self.capacity = block_size, capacity
        self._publish_stored, self._publish_removed = publish_stored, publish_removed
        self._blocks: OrderedDict[int, None] = OrderedDict()
        self._lock = threading.Lock()
        self._events: queue.SimpleQueue[tuple[str, dict[str, Any]] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._publish, name="kv-events", daemon=True)
        self._thread.start()

    def known_tokens(self, tokens: list[int]) -> int:
        """How many leading tokens of `tokens` lie in blocks this record holds."""
        known = 0
        with self._lock:
            for block in block_hashes(tokens, self.block_size):
                if block not in self._blocks:
                    break
                known += self.block_size
        return known

    def stored(self, tokens: list[int]) -> None:
        """The engine holds the KV of `tokens`' full blocks: publish the new ones, refresh the known ones."""
        hashes = block_hashes(tokens, self.block_size)
        removed: list[int] = []
        with self._lock:
            new_from = next((i for i, block in enumerate(hashes) if block not in self._blocks), len(hashes))
            for block in reversed(hashes):  # a block's parent is used more recently than it: children go first
                self._blocks[block] = None
                self._blocks.move_to_end(block)
            while len(self._blocks) > self.capacity:
                removed.append(self._blocks.popitem(last=False)[0])
        if new_from < len(hashes):
            size = self.block_size
            self._events.put(
                (
                    "stored",
                    {
                        "token_ids": tokens[new_from * size : len(hashes) * size],
                        "num_block_tokens": [size] * (len(hashes) - new_from),
                        "block_hashes": hashes[new_from:],
                        "parent_hash": hashes[new_from - 1] if new_from else None,
                    },
                )
            )
        if removed:
            self._events.put(("removed", {"block_hashes": removed}))

    def close(self) -> None:
        self._events.put(None)
        self._thread.join(5)

    def _publish(self) -> None:
        while (event := self._events.get()) is not None:
            kind, payload = event
            try:
                if kind == "stored":
                    self._publish_stored(**payload)
                else:
                    self._publish_removed(payload["block_hashes"])
            except Exception:
                LOG.exception("KV %s event not published", kind)


class DynamoEngineServer:
    """The server side of engine_loop.EngineLoop for Dynamo: builds jobs from requests, streams their tokens."""

    def __init__(self, engine: Any, arrival_window_s: float, kv_record: KvCacheRecord | None = None) -> None:
        from engine_loop import EngineLoop
        from genai_settings import PENALTIES, sampling_problem, set_penalties, set_sampling

        self.engine = engine
        self.kv_record = kv_record
        self._penalties, self._sampling_problem = PENALTIES, sampling_problem
        self._set_penalties, self._set_sampling = set_penalties, set_sampling
        self.loop = EngineLoop(engine, self, "dynamo-worker", arrival_window_s)

    # engine_loop.LoopServer
    def collect(self, job: WorkerJob, item: WorkerItem, now_ns: int, status: Any) -> None:
        from engine_loop import read_new

        tokens, _ = read_new(item)
        state = item.handle.get_status()
        if self.kv_record is not None and tokens and not item.output:
            self.kv_record.stored(item.prompt)  # its prefill ran: the prompt's blocks are in the engine's cache
        item.output.extend(tokens)
        if tokens and not job.closed:
            job.tokens += len(tokens)
            job.put({"token_ids": tokens})
        if state == status.IGNORED:
            self.refuse(job, "prompt: the request does not fit in the KV cache; shorten it or raise runtime.max_tokens_in_paged_kv_cache")
        elif state in (status.FINISHED, status.STOP, status.CANCEL):
            self.loop.active.pop(item.engine_id, None)
            if self.kv_record is not None and len(item.output) > 1:
                # The last token's KV was never computed: the blocks of the prompt and the rest of the output are.
                self.kv_record.stored(item.prompt + item.output[:-1])
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
        if self.kv_record is not None:
            LOG.info("request: %d prompt tokens, %d in blocks this worker published", len(prompt), self.kv_record.known_tokens(prompt))
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
    from dynamo.llm import KvEventPublisher, ModelInput, ModelRuntimeConfig, ModelType, WorkerType, register_model
    from dynamo.runtime import DistributedRuntime
    from engine_loop import load_engine
    from genai_settings import CPU_KV_BLOCK_SIZE, kv_blocks_for

    engine = load_engine(
        args.engine_dir,
        kv_tokens=args.kv_tokens,
        prefix_caching=args.prefix_caching,
        split_fuse=args.split_fuse,
        warn=LOG.warning,
    )
    LOG.info("%s", engine.description)
    kv_blocks = kv_blocks_for(args.kv_tokens or engine.max_batch_size * engine.max_seq_len)

    runtime = DistributedRuntime(asyncio.get_running_loop(), "file", "tcp")
    stopping = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stopping.set)
    endpoint = runtime.endpoint(args.endpoint)
    kv_record = None
    if args.publish_kv_events and engine.prefix_caching:
        publisher = KvEventPublisher(endpoint, kv_block_size=CPU_KV_BLOCK_SIZE)
        kv_record = KvCacheRecord(publisher.publish_stored, publisher.publish_removed, CPU_KV_BLOCK_SIZE, kv_blocks)
        LOG.info("publishing KV events: blocks of %d tokens, a record of at most %d blocks", CPU_KV_BLOCK_SIZE, kv_blocks)
    elif args.publish_kv_events:
        LOG.warning("--publish-kv-events without prefix caching: the engine keeps no blocks between requests, none published")
    server = DynamoEngineServer(engine, args.arrival_window_ms / 1000.0, kv_record)
    server.loop.start()
    runtime_config = ModelRuntimeConfig()
    runtime_config.max_num_seqs = engine.max_batch_size
    runtime_config.context_length = engine.max_seq_len
    runtime_config.total_kv_blocks = kv_blocks
    await register_model(
        ModelInput.Tokens,
        ModelType.Completions | ModelType.Chat,
        endpoint,
        args.model_dir,
        args.model_name,
        worker_type=WorkerType.Aggregated,
        kv_cache_block_size=CPU_KV_BLOCK_SIZE,
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
    if kv_record is not None:
        kv_record.close()


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--engine-modules", required=True, help="model_repo_templates/cpu/tensorrt_llm (engine_loop.py and its siblings)")
    parser.add_argument("--engine-dir", required=True)
    parser.add_argument("--model-dir", required=True, help="the HF directory the frontend reads (config.json, tokenizer)")
    parser.add_argument("--model-name", required=True)
    parser.add_argument("--endpoint", required=True, help="namespace.component.generate")
    parser.add_argument("--kv-tokens", type=int, default=None)
    parser.add_argument("--publish-kv-events", action="store_true", help="tell the KV router what the engine's prefix cache holds")
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
