"""The CPU `tensorrt_llm` model: TensorRT-LLM's tensor contract served by a CPU engine (OpenVINO GenAI, ONNX Runtime GenAI).

A Triton python-backend model (decoupled). Inputs and outputs have the names, dtypes and dims of the
TensorRT-LLM backend's `tensorrt_llm` model, so the ensemble, BLS, pre- and post-processing models of a GPU
deployment run unchanged in front of it. Inside, one engine per instance is driven by a background thread: every
Triton request item becomes an engine request (`add_request`), the thread calls `step()` and streams each request's
new tokens through its response sender as they come.

The engine is reached through its adapter (engine_adapter.py's protocol): the module beside this file that the
engine's config.json names (`"adapter"`: openvino_engine.py, ort_engine.py), written by the engine's builder.

Self-contained on purpose (numpy, triton_python_backend_utils, the standard library and the siblings render copies
beside it): it is copied into the model repository and runs in the Triton python stub, whose interpreter comes from
EXECUTION_ENV_PATH.

Model parameters read from config.pbtxt:
    gpt_model_path                engine directory (the engine's files + engine config.json) - required
    max_tokens_in_paged_kv_cache  KV cache size in tokens → GenAI KV blocks (default: max_batch_size * max_seq_len)
    enable_kv_cache_reuse         prefix caching
    enable_chunked_context        dynamic split-fuse (long prompts split across steps)
    exclude_input_in_output       default for requests that do not send it
    max_beam_width                must be 1 (beam search is not served on CPU)
    batch_scheduler_policy        accepted; GenAI's scheduler always behaves like max_utilization (it
                                  preempts and recomputes a sequence when the KV cache runs out)
    cancellation_check_period_ms  how often the engine asks whether clients went away (default 100)
    max_queue_size                requests admitted beyond the engine's max_batch_size before new ones
                                  are rejected (0 = unbounded)
    arrival_window_ms             after a step that ended two or more requests, how long the engine waits for as
                                  many new ones before its next step, and after an idle spell, how long it waits
                                  for more when the last idle spell ended with a burst (default ARRIVAL_WINDOW_MS;
                                  0 = never waits; decoupled only)
The scheduler comes from the engine's config.json (max_num_seqs = build_config.max_batch_size,
max_num_batched_tokens = build_config.max_num_tokens) and the runtime properties from its `openvino` section.
When that section names a draft model (`openvino.draft`, written by the build for engine.speculative draft_target),
the pipeline loads it as GenAI's draft_model and every request drafts `num_assistant_tokens` tokens per step:
draft-target speculative decoding, whose output is the target model's own.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils
from engine_loop import EngineLoop, EngineSetupError, load_engine, read_new

# Copied next to this file too: the GenAI settings this model shares with the LLM-API stand-in, and the KV pool commit.
from genai_settings import (
    ARRIVAL_WINDOW_MS,
    CPU_KV_BLOCK_SIZE,
    PENALTIES,
    sampling_problem,
    set_penalties,
    set_sampling,
)
from request_checks import InvalidInput, check_request  # copied next to this file: range checks of the inputs

# A send that has not returned after this long is taken as a consumer that will never read (a dead BLS stub):
# its request is dropped so it cannot hold back every other stream.
SEND_STALL_S = 2.0

# Inputs the TensorRT-LLM contract declares that this engine cannot honour: refused when they carry data,
# so a client never silently gets something other than what it asked for.
UNSUPPORTED_INPUTS = (
    "encoder_input_features",
    "draft_input_ids",
    "draft_logits",
    "prompt_embedding_table",
    "lora_weights",
    "lora_config",
    "guided_decoding_guide",
    "context_phase_params",
    "cross_attention_mask",
)


class RequestError(Exception):
    """A request the model refuses; becomes an error response for that request only."""


def _param(params: dict, key: str, default: Any = None) -> Any:
    value = params.get(key, {}).get("string_value", "")
    if value == "" or value.startswith("${"):
        return default
    return value


def _param_bool(params: dict, key: str, default: bool) -> bool:
    value = _param(params, key)
    if value is None:
        return default
    return value.strip().lower() in ("1", "true", "t", "yes", "y", "on")


def _param_int(params: dict, key: str, default: Any) -> Any:
    value = _param(params, key)
    if value is None:
        return default
    try:
        return int(value)
    except ValueError:
        raise pb_utils.TritonModelException(f"parameter {key}: {value!r} is not an integer") from None


# The nvidia-pytriton 2.51 stub was built against numpy 1: under numpy 2 its ndarray <-> tensor conversion
# reads numpy's array descriptor with the old layout, so numeric outputs arrive with a shape but no data and
# inputs are misread. DLPack does not go through that struct; numpy 1.x (the stub env deploy prepares)
# takes the ordinary path, whose DLPack capsule handling it does not support.
_NUMPY2 = int(np.__version__.split(".")[0]) >= 2


def _tensor(name: str, array: Any) -> Any:
    array = np.ascontiguousarray(array)
    if _NUMPY2:
        return pb_utils.Tensor.from_dlpack(name, array)
    return pb_utils.Tensor(name, array)


def _input(request: Any, name: str) -> Any:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return None
    if _NUMPY2:
        try:
            return np.from_dlpack(tensor)
        except Exception:
            pass
    return tensor.as_numpy()


def _item_scalar(array: Any, index: int, default: Any = None) -> Any:
    """Scalar of batch item `index` from a [B], [B, 1] (or [1]) input; `default` when absent."""
    if array is None or array.size == 0:
        return default
    flat = array.reshape(array.shape[0], -1) if array.ndim > 1 else array.reshape(-1, 1)
    row = flat[index] if flat.shape[0] > index else flat[0]
    return row.reshape(-1)[0].item()


def _word_list(array: Any, index: int) -> list[list[int]]:
    """TensorRT-LLM word-list format [B, 2, L]: row 0 token ids, row 1 cumulative end offsets (-1 padded)."""
    if array is None or array.size == 0:
        return []
    item = array[index] if array.ndim == 3 else array
    ids, offsets = item[0], item[1]
    words, start = [], 0
    for end in offsets:
        end = int(end)
        if end < 0:
            break
        if end > start:
            words.append([int(t) for t in ids[start:end]])
        start = end
    return words


@dataclass
class Item:
    """One sequence of a Triton request (a request with batch B has B items)."""

    batch_index: int
    prompt: list[int]
    max_new_tokens: int
    config: Any  # the adapter's GenerationConfig
    stop_sequences: list[list[int]]
    engine_id: int = -1
    handle: Any = None
    tokens: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    done: bool = False
    first_scheduled_ns: int = 0
    first_token_ns: int = 0
    last_token_ns: int = 0


@dataclass
class Job:
    """A Triton request: its items, per-request options and where its responses go."""

    request: Any
    sender: Any  # response sender (decoupled) or None (collect for execute's return)
    items: list[Item]
    streaming: bool
    exclude_input: bool
    want_log_probs: bool
    want_perf: bool
    want_num_input: bool
    want_num_output: bool
    requested: set
    request_id: str
    arrival_ns: int
    pending: int = 0
    collected: list = field(default_factory=list)  # non-decoupled: responses for execute to return
    finished: threading.Event = field(default_factory=threading.Event)
    closed: bool = False
    unreachable: bool = False  # a send to it blocked past SEND_STALL_S: nothing more is sent to it
    released: bool = False  # counted out of jobs_in_flight
    finalized: bool = False  # its final response is being sent: Triton may free the request (see Outbox.final_lock)


class Outbox:
    """Hands decoupled responses to Triton from a send thread, in order, and lets the engine wait until they left.

    OpenVINO GenAI's `step()` holds the GIL for the whole step, so a send thread only runs while the engine
    thread waits. Without `flush()` after each step, responses pile up for several steps and leave in bursts
    (tokens clump at the client). `flush()` waits until every queued response was sent; a send that blocks
    longer than SEND_STALL_S (a consumer that never reads, e.g. a dead BLS stub) gets its job marked
    unreachable, its remaining responses dropped, and a new send thread takes over the queue, so one dead
    consumer cannot stall the other streams.
    """

    def __init__(self, name: str, warn: Callable[[str], None]) -> None:
        self.name = name
        self.warn = warn
        self.cond = threading.Condition()
        self.entries: deque[tuple[Job, Any, int]] = deque()
        self.busy_job: Job | None = None  # the job whose send is in progress
        self.busy_since = 0.0
        self.generation = 0  # a send thread whose generation is stale exits (it was replaced)
        # Asking whether a request was cancelled after its final response was sent crashes tritonserver (the
        # request is freed: SIGSEGV in TRITONBACKEND_ResponseFactoryIsCancelled). The cancellation watcher asks
        # under this lock and only for jobs not finalized; a final send marks its job under the same lock first.
        self.final_lock = threading.Lock()
        self.closing = False
        self.threads: list[threading.Thread] = []
        self._start_thread()

    def _start_thread(self) -> None:
        thread = threading.Thread(target=self._run, args=(self.generation,), name=f"{self.name}-send{self.generation}", daemon=True)
        self.threads.append(thread)
        thread.start()

    def put(self, job: Job, response: Any, flags: int) -> None:
        with self.cond:
            if job.unreachable:
                return
            last = self.entries[-1] if self.entries else None
            if response is None and last is not None and last[0] is job and last[1] is not None and last[2] == 0:
                # The end of a job whose last response has not left yet: it carries the final flag itself, as
                # TensorRT-LLM's last response does; one send (and one trip through the ensemble) fewer per request.
                self.entries[-1] = (job, last[1], flags)
            else:
                self.entries.append((job, response, flags))
            self.cond.notify_all()

    def _run(self, generation: int) -> None:
        while True:
            with self.cond:
                while not self.entries and not self.closing and generation == self.generation:
                    self.cond.wait()
                if generation != self.generation or not self.entries:
                    return
                job, response, flags = self.entries.popleft()
                self.busy_job, self.busy_since = job, time.monotonic()
            if flags & pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL:
                with self.final_lock:  # waits for a cancellation check of this job in progress
                    job.finalized = True
            try:
                if response is None:
                    job.sender.send(flags=flags)
                else:
                    job.sender.send(response, flags=flags)
            except Exception as exc:
                self.warn(f"{self.name}: could not send a response: {exc}")
            with self.cond:
                if generation != self.generation:
                    return  # declared stalled while blocked; the new thread owns the queue
                self.busy_job = None
                self.cond.notify_all()

    def flush(self) -> list[Job]:
        """Wait until every queued response was sent; returns the jobs found unreachable meanwhile.

        It waits for the last send to return too: letting the next step start while that send was still in
        progress made tokens clump again (ITL p99 3.8x TPOT p50 instead of 1.5x at concurrency 8)."""
        dropped: list[Job] = []
        with self.cond:
            while self.entries or self.busy_job is not None:
                stalled = self.busy_job
                if stalled is not None and time.monotonic() - self.busy_since > SEND_STALL_S:
                    stalled.unreachable = True
                    dropped.append(stalled)
                    self.entries = deque(e for e in self.entries if e[0] is not stalled)
                    self.busy_job = None
                    self.generation += 1
                    self.warn(
                        f"{self.name}: a send blocked for more than {SEND_STALL_S:.0f}s; dropping request {stalled.request_id or '(no id)'}"
                    )
                    self._start_thread()
                    continue
                self.cond.wait(timeout=SEND_STALL_S / 4)
        return dropped

    def close(self, timeout_s: float) -> None:
        with self.cond:
            self.closing = True
            self.cond.notify_all()
        for thread in self.threads:
            thread.join(timeout=timeout_s)


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        model_config = json.loads(args["model_config"])
        params = model_config.get("parameters", {})
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(model_config)
        self.instance = args.get("model_instance_name", "tensorrt_llm")

        max_beam_width = _param_int(params, "max_beam_width", 1)
        if max_beam_width != 1:
            raise pb_utils.TritonModelException(f"parameter max_beam_width: {max_beam_width}; the CPU engine serves beam width 1 only")
        try:
            engine = load_engine(
                _param(params, "gpt_model_path"),
                kv_tokens=_param_int(params, "max_tokens_in_paged_kv_cache", None),
                prefix_caching=_param_bool(params, "enable_kv_cache_reuse", False),
                split_fuse=_param_bool(params, "enable_chunked_context", False),
                warn=lambda message: pb_utils.Logger.log_warn(f"{self.instance}: {message}"),
            )
        except EngineSetupError as exc:
            where = exc.setting if exc.setting.endswith("config.json") else f"parameter {exc.setting}"
            raise pb_utils.TritonModelException(f"{where}: {exc.problem}") from None
        self.adapter = engine.adapter
        self.vocab_size = engine.vocab_size
        self.max_batch_size = engine.max_batch_size
        self.max_input_len = engine.max_input_len
        self.max_seq_len = engine.max_seq_len
        self.default_eos = engine.default_eos
        self.num_assistant_tokens = engine.num_assistant_tokens
        self.exclude_input_default = _param_bool(params, "exclude_input_in_output", False)
        self.max_queue_size = _param_int(params, "max_queue_size", 0)
        self.cancel_check_period_s = _param_int(params, "cancellation_check_period_ms", 100) / 1000.0
        # Not decoupled, a request's successor can only come after Triton's execute call returns, which waits for every
        # job of its batch: the window would wait for what cannot arrive.
        window_ms = _param_int(params, "arrival_window_ms", ARRIVAL_WINDOW_MS) if self.decoupled else 0
        pb_utils.Logger.log_info(f"{self.instance}: {engine.description} (decoupled={self.decoupled}, arrival_window_ms={window_ms:g})")

        # The engine loop (engine_loop.py) owns the pipeline; this model turns Triton requests into its jobs and
        # its tokens into responses (collect, fail, after_step below).
        self.loop = EngineLoop(engine, self, self.instance, window_ms / 1000.0)
        self.incoming = self.loop.incoming
        self.active: dict[int, tuple[Job, Item]] = self.loop.active
        self.stopping = self.loop.stopping
        self.jobs_in_flight = 0
        self.count_lock = threading.Lock()
        self.outbox = Outbox(self.instance, pb_utils.Logger.log_warn)
        self.loop.start()
        self.watch_thread = threading.Thread(target=self._watch_cancellations, name=f"{self.instance}-cancel", daemon=True)
        self.watch_thread.start()

    # ----------------------------------------------------------------------------------------------
    # Request intake (Triton's thread)

    def execute(self, requests: list[Any]) -> list[Any] | None:
        jobs: list[Job] = []
        for request in requests:
            sender = request.get_response_sender() if self.decoupled else None
            try:
                job = self._parse(request, sender)
            except RequestError as exc:
                self._reject(request, sender, str(exc), jobs)
                continue
            except Exception as exc:
                self._reject(request, sender, f"invalid request: {type(exc).__name__}: {exc}", jobs)
                continue
            if job is None:  # a `stop` request, already answered
                continue
            with self.count_lock:
                if self.max_queue_size > 0 and self.jobs_in_flight >= self.max_batch_size + self.max_queue_size:
                    full = True
                else:
                    full = False
                    self.jobs_in_flight += 1
            if full:
                self._reject(request, sender, f"queue full: {self.max_queue_size} requests already wait; retry later", jobs)
                continue
            jobs.append(job)
            self.incoming.put(job)
        if self.decoupled:
            return None
        responses = []
        for job in jobs:
            job.finished.wait()
            responses.append(job.collected[0] if job.collected else pb_utils.InferenceResponse(output_tensors=[]))
        return responses

    def _reject(self, request: Any, sender: Any, message: str, jobs: list) -> None:
        code = pb_utils.TritonError.UNAVAILABLE if message.startswith("queue full") else pb_utils.TritonError.INVALID_ARG
        response = pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(message, code))
        if sender is not None:
            sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        else:
            done = Job(request, None, [], False, False, False, False, False, False, set(), "", 0)
            done.collected.append(response)
            done.finished.set()
            jobs.append(done)

    def _parse(self, request: Any, sender: Any) -> Job | None:
        arrival = time.time_ns()
        if bool(_item_scalar(_input(request, "stop"), 0, False)):
            self.incoming.put(functools.partial(self._stop_by_id, request.request_id()))
            if sender is not None:
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                return None
            raise RequestError("stop: cancelled the request with this id")
        for name in UNSUPPORTED_INPUTS:
            value = _input(request, name)
            if value is not None and value.size:
                raise RequestError(f"{name}: not supported by the CPU engine; remove it")
        for flag in ("return_context_logits", "return_generation_logits"):
            if bool(_item_scalar(_input(request, flag), 0, False)):
                raise RequestError(f"{flag}: logits are not returned by the CPU engine; set it false")

        try:
            check_request(lambda name: _input(request, name), "tensorrt_llm", self.vocab_size, self.max_seq_len - 1)
        except InvalidInput as exc:
            raise RequestError(str(exc)) from None
        input_ids = _input(request, "input_ids")
        if input_ids is None:
            raise RequestError("input_ids: missing; send the prompt's token ids")
        if input_ids.ndim == 1:
            input_ids = input_ids.reshape(1, -1)
        batch = input_ids.shape[0]
        if batch > 1 and not self.decoupled:
            raise RequestError(f"input_ids: a batch of {batch} needs the model in decoupled mode; send one sequence")
        lengths = _input(request, "input_lengths")
        output_lens = _input(request, "request_output_len")
        if output_lens is None:
            raise RequestError("request_output_len: missing; send the number of tokens to generate (>= 1)")

        streaming = bool(_item_scalar(_input(request, "streaming"), 0, False))
        if streaming and not self.decoupled:
            raise RequestError("streaming: needs the model in decoupled mode; send streaming false")
        exclude = _item_scalar(_input(request, "exclude_input_in_output"), 0, None)
        requested = set(request.requested_output_names() or [])

        items = []
        for b in range(batch):
            row = input_ids[b].reshape(-1)
            length = int(_item_scalar(lengths, b, row.size))
            if length <= 0 or row.size == 0:
                raise RequestError("input_ids: the prompt is empty; send at least one token")
            if length > row.size:
                raise RequestError(f"input_lengths: {length} is longer than input_ids ({row.size})")
            if length > self.max_input_len:
                raise RequestError(
                    f"input_ids: the prompt has {length} tokens, more than the engine's max_input_len {self.max_input_len}; shorten it"
                )
            prompt = [int(t) for t in row[:length]]
            if min(prompt) < 0 or max(prompt) >= self.vocab_size:
                raise RequestError(f"input_ids: token ids must be in [0, {self.vocab_size})")
            max_new = int(_item_scalar(output_lens, b, 0))
            if max_new <= 0:
                raise RequestError(f"request_output_len: {max_new}; must be >= 1")
            # As TensorRT-LLM does: cut the output so prompt + output fits max_seq_len.
            max_new = min(max_new, self.max_seq_len - length)
            if max_new <= 0:
                raise RequestError(f"input_ids: a {length}-token prompt leaves no room within max_seq_len {self.max_seq_len}")
            beam = int(_item_scalar(_input(request, "beam_width"), b, 1))
            if beam != 1:
                raise RequestError(f"beam_width: {beam}; the CPU engine serves beam width 1 only")
            num_seq = int(_item_scalar(_input(request, "num_return_sequences"), b, 1))
            if num_seq != 1:
                raise RequestError(f"num_return_sequences: {num_seq}; the CPU engine returns 1 sequence")
            bad_words = _word_list(_input(request, "bad_words_list"), b)
            if bad_words:
                raise RequestError("bad_words_list: not supported by the CPU engine; send it empty")
            stop_words = _word_list(_input(request, "stop_words_list"), b)
            config = self._generation_config(request, b, max_new, stop_words)
            items.append(Item(b, prompt, max_new, config, [w for w in stop_words if len(w) > 1]))

        return Job(
            request=request,
            sender=sender,
            items=items,
            streaming=streaming,
            exclude_input=self.exclude_input_default if exclude is None else bool(exclude),
            want_log_probs=bool(_item_scalar(_input(request, "return_log_probs"), 0, False)),
            want_perf=bool(_item_scalar(_input(request, "return_perf_metrics"), 0, False)),
            want_num_input=bool(_item_scalar(_input(request, "return_num_input_tokens"), 0, False)),
            want_num_output=bool(_item_scalar(_input(request, "return_num_output_tokens"), 0, False)),
            requested=requested,
            request_id=request.request_id(),
            arrival_ns=arrival,
            pending=len(items),
        )

    def _generation_config(self, request: Any, b: int, max_new: int, stop_words: list[list[int]]) -> Any:
        config = self.adapter.GenerationConfig()
        config.max_new_tokens = max_new
        end_id = _item_scalar(_input(request, "end_id"), b, None)
        eos = [int(end_id)] if end_id is not None else list(self.default_eos)
        # end_id -1 (TensorRT-LLM: generate to the full length) or an id no token has (how benchmarks force the
        # output length) never stops a sequence; OpenVINO GenAI crashes on an EOS id outside the vocabulary.
        never_ends = end_id is not None and not 0 <= int(end_id) < self.vocab_size
        stop_ids = set() if never_ends else set(eos)
        stop_ids.update(w[0] for w in stop_words if len(w) == 1)
        if never_ends:
            config.ignore_eos = True
        elif eos:
            config.eos_token_id = eos[0]
        config.stop_token_ids = stop_ids
        min_tokens = _item_scalar(_input(request, "min_tokens"), b, None)
        if min_tokens is None:
            min_tokens = _item_scalar(_input(request, "min_length"), b, None)
        if min_tokens:
            config.min_new_tokens = int(min_tokens)

        # TensorRT-LLM semantics: top_k 0/1 with top_p 0 is greedy; otherwise sample.
        top_k = int(_item_scalar(_input(request, "runtime_top_k"), b, 0) or 0)
        top_p = float(_item_scalar(_input(request, "runtime_top_p"), b, 0.0) or 0.0)
        temperature = float(_item_scalar(_input(request, "temperature"), b, 1.0))
        if (top_k > 1 or top_p > 0.0) and temperature > 0.0:
            seed = _item_scalar(_input(request, "seed"), b, None)
            if seed is None:
                seed = _item_scalar(_input(request, "random_seed"), b, None)
            set_sampling(config, temperature, top_k, top_p, seed)
        else:
            config.do_sample = False
        set_penalties(config, {name: _item_scalar(_input(request, name), b, None) for name in PENALTIES})
        if bool(_item_scalar(_input(request, "return_log_probs"), 0, False)):
            config.logprobs = 1
        if self.num_assistant_tokens:
            config.num_assistant_tokens = self.num_assistant_tokens
        problem = sampling_problem(config)
        if problem:
            raise RequestError(problem)
        return config

    # ----------------------------------------------------------------------------------------------
    # The engine loop (one background thread owns the pipeline)

    def collect(self, job: Job, item: Item, now_ns: int, status: Any) -> None:
        self._collect(job, item, now_ns, status)

    def fail(self, job: Job, message: str) -> None:
        self._fail(job, message)

    def after_step(self) -> None:
        self._flush_outbox()

    def log_error(self, message: str) -> None:
        pb_utils.Logger.log_error(message)

    def _stop_by_id(self, request_id: str) -> None:
        if not request_id:
            pb_utils.Logger.log_warn(f"{self.instance}: stop request without a request id ignored")
            return
        for job, item in list(self.active.values()):
            if job.request_id == request_id:
                # Ends like a finished request at the next collect: what was generated so far is returned.
                item.handle.stop()

    def _watch_cancellations(self) -> None:
        """Ask Triton every cancellation_check_period_ms whether the clients of the running requests went away.

        Each check is a round trip to the server process. Done on the engine thread, the engine waited for one
        per request every period (16 at concurrency 16); here the round trip runs while the engine steps (it
        releases the GIL) and a cancelled request reaches the engine loop as a message."""
        while not self.stopping.wait(self.cancel_check_period_s):
            seen = set()
            for job, _ in list(self.active.values()):
                if id(job) in seen or job.sender is None:
                    continue
                seen.add(id(job))
                with self.outbox.final_lock:
                    cancelled = not job.finalized and not job.closed and self._is_cancelled(job)
                if cancelled:
                    self.incoming.put(functools.partial(self._cancel, job))

    def _cancel(self, job: Job) -> None:
        if job.closed:  # ended meanwhile: its final response is sent or on its way
            return
        generated = sum(len(item.tokens) for item in job.items)
        pb_utils.Logger.log_info(f"{self.instance}: request {job.request_id or '(no id)'} cancelled by the client after {generated} tokens")
        self._end_in_engine(job)
        self.outbox.put(
            job,
            pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError("cancelled", pb_utils.TritonError.CANCELLED)),
            pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
        )

    @staticmethod
    def _is_cancelled(job: Job) -> bool:
        try:
            return bool(job.sender.is_cancelled())
        except Exception:
            return True

    def _collect(self, job: Job, item: Item, now: int, status: Any) -> None:
        handle = item.handle
        state = handle.get_status()
        new_tokens, new_log_probs = read_new(item)
        if new_tokens:
            if not item.first_token_ns:
                item.first_token_ns = now
            item.last_token_ns = now
            item.tokens.extend(new_tokens)
            item.log_probs.extend(new_log_probs)
        stopped_by_word = bool(new_tokens) and self._hit_stop_sequence(item)
        if stopped_by_word and state == status.RUNNING:
            handle.stop()
        if job.streaming and new_tokens and not job.closed:
            self._send(job, self._response(job, item, new_tokens, new_log_probs))
        if state == status.IGNORED:
            self._fail(job, "the request does not fit in the KV cache; raise max_tokens_in_paged_kv_cache or shorten it")
        elif state in (status.FINISHED, status.STOP, status.CANCEL) or stopped_by_word:
            self._finish_item(job, item)

    @staticmethod
    def _hit_stop_sequence(item: Item) -> bool:
        tail = item.tokens
        return any(len(tail) >= len(w) and tail[-len(w) :] == w for w in item.stop_sequences)

    def _finish_item(self, job: Job, item: Item, cancelled: bool = False) -> None:
        if item.done:
            return
        item.done = True
        self.active.pop(item.engine_id, None)
        if not job.streaming and not cancelled:
            tokens = item.tokens if job.exclude_input else item.prompt + item.tokens
            log_probs = item.log_probs if job.exclude_input else [0.0] * len(item.prompt) + item.log_probs
            self._send(job, self._response(job, item, tokens, log_probs))
        job.pending -= 1
        if job.pending <= 0:
            self._close(job)

    def _fail(self, job: Job, message: str) -> None:
        for item in job.items:
            if item.engine_id in self.active:
                with contextlib.suppress(Exception):
                    item.handle.stop()
                self.active.pop(item.engine_id, None)
        if job.closed:
            return
        job.closed = True
        self._release(job)
        response = pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(message))
        if job.sender is None:
            job.collected[:] = [response]
            job.finished.set()
            return
        self.outbox.put(job, response, pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def _close(self, job: Job) -> None:
        if job.sender is None:
            job.finished.set()
        elif not job.closed:
            self.outbox.put(job, None, pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        job.closed = True
        self._release(job)

    def _release(self, job: Job) -> None:
        if job.released:
            return
        job.released = True
        with self.count_lock:
            self.jobs_in_flight -= 1

    def _send(self, job: Job, response: Any) -> None:
        if job.sender is None:
            job.collected.append(response)
            return
        self.outbox.put(job, response, 0)

    def _flush_outbox(self) -> None:
        """Let this step's responses leave before the next step (see Outbox); stop requests nobody reads."""
        for job in self.outbox.flush():
            self._end_in_engine(job)

    def _end_in_engine(self, job: Job) -> None:
        """Stop the job's sequences in the engine, mark it closed and release what it held."""
        for item in job.items:
            if item.engine_id in self.active:
                item.handle.stop()
                self.active.pop(item.engine_id, None)
        job.closed = True
        self._release(job)

    # ----------------------------------------------------------------------------------------------
    # Responses in the TensorRT-LLM shapes ([batch=1, beam=1, tokens] etc.)

    def _response(self, job: Job, item: Item, tokens: list[int], log_probs: list[float]) -> Any:
        n = len(tokens)
        outputs: dict[str, np.ndarray] = {
            "output_ids": np.asarray(tokens, dtype=np.int32).reshape(1, 1, n),
            "sequence_length": np.asarray([[n]], dtype=np.int32),
        }
        # Like TensorRT-LLM: log probs only when asked for, batch and sequence index for batched requests.
        # Every tensor costs a shared-memory round trip per streamed token.
        if job.want_log_probs:
            outputs["cum_log_probs"] = np.asarray([[sum(item.log_probs)]], dtype=np.float32)
            outputs["output_log_probs"] = np.asarray(log_probs, dtype=np.float32).reshape(1, 1, n)
        if len(job.items) > 1:
            outputs["batch_index"] = np.asarray([[item.batch_index]], dtype=np.int32)
            outputs["sequence_index"] = np.asarray([[0]], dtype=np.int32)
        if job.want_perf:
            blocks = math.ceil((len(item.prompt) + len(item.tokens)) / CPU_KV_BLOCK_SIZE)
            outputs.update(
                {
                    "arrival_time_ns": np.asarray([[job.arrival_ns]], dtype=np.int64),
                    "first_scheduled_time_ns": np.asarray([[item.first_scheduled_ns]], dtype=np.int64),
                    "first_token_time_ns": np.asarray([[item.first_token_ns]], dtype=np.int64),
                    "last_token_time_ns": np.asarray([[item.last_token_ns]], dtype=np.int64),
                    "kv_cache_alloc_new_blocks": np.asarray([[blocks]], dtype=np.int32),
                    "kv_cache_reused_blocks": np.asarray([[0]], dtype=np.int32),
                    "kv_cache_alloc_total_blocks": np.asarray([[blocks]], dtype=np.int32),
                    "acceptance_rate": np.asarray([[0.0]], dtype=np.float32),
                    "total_accepted_draft_tokens": np.asarray([[0]], dtype=np.int32),
                    "total_draft_tokens": np.asarray([[0]], dtype=np.int32),
                }
            )
        if job.want_num_input:
            outputs["num_input_tokens"] = np.asarray([[len(item.prompt)]], dtype=np.int32)
        if job.want_num_output:
            outputs["num_output_tokens"] = np.asarray([[len(item.tokens)]], dtype=np.int32)
        names = [k for k in outputs if not job.requested or k in job.requested]
        return pb_utils.InferenceResponse(output_tensors=[_tensor(k, outputs[k]) for k in names])

    def finalize(self) -> None:
        self.loop.stop(timeout_s=30)
        self.watch_thread.join(timeout=30)
        self.outbox.close(timeout_s=30)
        del self.loop  # the last reference to the pipeline
