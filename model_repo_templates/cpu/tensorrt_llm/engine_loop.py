"""The CPU engine and its loop, without Triton: one definition for every server that drives a CPU engine.

`load_engine` reads the engine directory (its config.json: limits, adapter, OpenVINO section, draft model), builds
the scheduler and runtime properties from genai_settings.py, loads the engine through its adapter and warms it up.
`EngineLoop` is the background thread that owns the pipeline: it admits jobs from a queue (with the arrival windows
that let requests arriving together share one prefill step), calls `step()`, and hands every running sequence to
its server's `collect`. The Triton CPU model (model.py beside this file) and the Dynamo worker
(trtllm_forge/deploy/dynamo_worker.py) are its two servers: they turn requests into jobs and tokens into responses.

Standard library only (the adapter module brings the engine): render copies it beside model.py, and the Dynamo
worker imports it from this folder.
"""

from __future__ import annotations

import json
import os
import queue
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from engine_adapter import DraftModel, EngineAdapter, Pipeline, load_adapter
from genai_settings import (
    CPU_KV_BLOCK_SIZE,
    IDLE_WAIT_S,
    default_eos_ids,
    kv_blocks_for,
    pipeline_properties,
    scheduler_config,
)


class EngineSetupError(ValueError):
    """The engine cannot be loaded with these settings: `setting` names what to change."""

    def __init__(self, setting: str, problem: str) -> None:
        super().__init__(f"{setting}: {problem}")
        self.setting = setting
        self.problem = problem


@dataclass
class LoadedEngine:
    """A loaded, warmed-up CPU engine and the limits its requests are checked against."""

    adapter: EngineAdapter
    pipeline: Pipeline
    engine_dir: str
    vocab_size: int
    max_batch_size: int
    max_input_len: int
    max_seq_len: int
    default_eos: list[int]
    num_assistant_tokens: int  # draft-target: tokens the draft proposes per step (0: no draft model)
    prefix_caching: bool
    description: str  # one line for the server's load log


def load_engine(
    engine_dir: str, *, kv_tokens: int | None, prefix_caching: bool, split_fuse: bool, warn: Callable[[str], None]
) -> LoadedEngine:
    """The engine of `engine_dir` with a KV cache of `kv_tokens` (None: max_batch_size x max_seq_len), loaded by the
    adapter its config.json names and warmed up. EngineSetupError names the setting that is wrong."""
    if not engine_dir or not os.path.isdir(engine_dir):
        raise EngineSetupError("gpt_model_path", f"{engine_dir!r} is not a directory; set it to the engine directory")
    with open(os.path.join(engine_dir, "config.json")) as handle:
        engine = json.load(handle)
    build = engine["build_config"]
    pretrained = engine["pretrained_config"]
    ov_section = engine.get("openvino", {})
    try:
        adapter = load_adapter(engine.get("adapter"))
    except (ImportError, ValueError) as exc:
        raise EngineSetupError(f"{engine_dir}/config.json", str(exc)) from None
    max_batch_size = int(build["max_batch_size"])
    max_input_len = int(build["max_input_len"])
    max_seq_len = int(build["max_seq_len"])
    kv_tokens = kv_tokens or max_batch_size * max_seq_len
    kv_blocks = kv_blocks_for(kv_tokens)
    if kv_blocks * CPU_KV_BLOCK_SIZE < max_seq_len:
        raise EngineSetupError(
            "max_tokens_in_paged_kv_cache",
            f"{kv_tokens} cannot hold one sequence of max_seq_len {max_seq_len}; set at least {max_seq_len}",
        )
    scheduler = scheduler_config(
        adapter,
        kv_blocks=kv_blocks,
        max_batch_size=max_batch_size,
        max_num_tokens=build.get("max_num_tokens"),
        max_input_len=max_input_len,
        prefix_caching=prefix_caching,
        split_fuse=split_fuse,
    )
    properties = pipeline_properties(ov_section.get("properties"))
    # Draft-target speculative decoding: the build exported the draft model into the engine directory.
    draft = ov_section.get("draft") or None
    num_assistant_tokens = int(draft["num_assistant_tokens"]) if draft else 0
    draft_model = None
    if draft:
        # The draft compiles with the target's precision hints plus its own (e.g. fewer threads: see DRAFT_PROPERTIES).
        draft_properties = {**properties, **{str(k): str(v) for k, v in (draft.get("properties") or {}).items()}}
        draft_model = DraftModel(os.path.join(engine_dir, draft["subdir"]), draft_properties)
        if scheduler.dynamic_split_fuse:
            # OpenVINO GenAI emits wrong tokens with speculative decoding plus chunked prefill.
            warn("enable_chunked_context is ignored with a draft model")
            scheduler.dynamic_split_fuse = False
            scheduler.max_num_batched_tokens = max(scheduler.max_num_batched_tokens, max_input_len)

    started = time.monotonic()
    pipeline = adapter.load(engine_dir, scheduler, properties, draft_model)
    loaded = time.monotonic() - started
    warmed = adapter.warm_up(pipeline, max_batch_size, num_assistant_tokens)
    description = (
        f"{adapter.ENGINE_VERSION} engine {engine_dir} loaded in "
        f"{loaded:.1f}s (kv_blocks={kv_blocks}, max_num_seqs={scheduler.max_num_seqs}, "
        f"max_num_batched_tokens={scheduler.max_num_batched_tokens}, prefix_caching={scheduler.enable_prefix_caching}, "
        f"dynamic_split_fuse={scheduler.dynamic_split_fuse}, properties={properties}, "
        f"draft={draft['subdir'] + ' x' + str(num_assistant_tokens) if draft else None}"
        f"{' ' + str(draft.get('properties') or {}) if draft else ''}); {warmed}"
    )
    return LoadedEngine(
        adapter=adapter,
        pipeline=pipeline,
        engine_dir=engine_dir,
        vocab_size=int(pretrained["vocab_size"]),
        max_batch_size=max_batch_size,
        max_input_len=max_input_len,
        max_seq_len=max_seq_len,
        default_eos=default_eos_ids(engine_dir),
        num_assistant_tokens=num_assistant_tokens,
        prefix_caching=bool(scheduler.enable_prefix_caching),
        description=description,
    )


class EngineItem(Protocol):
    """One engine sequence of a job (model.py's Item, the Dynamo worker's request)."""

    prompt: list[int]
    config: Any  # the adapter's GenerationConfig
    engine_id: int
    handle: Any
    first_scheduled_ns: int


class Job(Protocol):
    """What a server queues: its sequences, and whether it ended before the engine took it."""

    @property
    def items(self) -> Sequence[Any]: ...  # EngineItem members

    @property
    def closed(self) -> bool: ...


class LoopServer(Protocol):
    """What the loop asks of the server that feeds it (model.py's TritonPythonModel, the Dynamo worker)."""

    def collect(self, job: Any, item: Any, now_ns: int, status: Any) -> None:
        """After a step: read the item's new tokens (`read_new`) and act on its status (an adapter GenerationStatus)."""

    def fail(self, job: Any, message: str) -> None:
        """End the job with an error (its items leave `active`)."""

    def after_step(self) -> None:
        """Once per step, after every collect (Triton: let the step's responses leave)."""

    def log_error(self, message: str) -> None: ...


def read_new(item: Any) -> tuple[list[int], list[float]]:
    """The tokens (and log probabilities) the engine generated for `item` since the last read."""
    tokens: list[int] = []
    log_probs: list[float] = []
    handle = item.handle
    if handle.can_read():
        for output in handle.read().values():
            tokens.extend(int(t) for t in output.generated_ids)
            log_probs.extend(float(p) for p in output.generated_log_probs)
    return tokens, log_probs


class EngineLoop:
    """The thread that owns the pipeline. Servers put jobs (Job) and control messages (callables, run on the loop's
    thread between steps: cancel, stop) on `incoming`; `active` maps engine ids to (job, item) while they run."""

    def __init__(self, engine: LoadedEngine, server: LoopServer, name: str, arrival_window_s: float) -> None:
        self.engine = engine
        self.pipeline = engine.pipeline
        self.server = server
        self.name = name
        self.arrival_window_s = arrival_window_s
        self.incoming: queue.Queue[Any] = queue.Queue()
        self.active: dict[int, tuple[Any, Any]] = {}
        self.next_engine_id = 0
        self.awaited = 0  # requests ended by recent steps whose successors have not arrived (see _await_arrivals)
        self.awaited_until = 0.0
        self.burst_until = 0.0  # the arrival window after the last idle spell ended (see _after_idle)
        self.burst_admitted = 0  # requests admitted within it
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self.run, name=f"{name}-engine", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self, timeout_s: float) -> None:
        self.stopping.set()
        self.thread.join(timeout=timeout_s)

    def run(self) -> None:
        status = self.engine.adapter.GenerationStatus
        while not self.stopping.is_set():
            try:
                # Requests stopped on our side (cancelled, failed) stay in GenAI until a step drops them.
                pending = self.pipeline.has_non_finished_requests()
                idle = not self.active and not pending
                self._admit(block=idle)
                if idle and self.active:
                    self._after_idle()
                self._await_arrivals()
                if not self.active and not pending:
                    continue
                try:
                    self.pipeline.step()
                except Exception as exc:
                    self.server.log_error(f"{self.name}: step failed: {exc}\n{traceback.format_exc()}")
                    for job, _item in list(self.active.values()):
                        self.server.fail(job, f"engine step failed: {exc}")
                    time.sleep(IDLE_WAIT_S)
                    continue
                now = time.time_ns()
                running = len(self.active)
                for _engine_id, (job, item) in list(self.active.items()):
                    try:
                        self.server.collect(job, item, now, status)
                    except Exception as exc:
                        self.server.log_error(f"{self.name}: request failed: {exc}\n{traceback.format_exc()}")
                        self.server.fail(job, f"internal error: {type(exc).__name__}: {exc}")
                self.server.after_step()
                ended = running - len(self.active)
                if ended >= 2 and self.arrival_window_s > 0:  # one successor alone has no other arrival to join
                    self.awaited = ended
                    self.awaited_until = time.monotonic() + self.arrival_window_s
            except Exception as exc:
                self.server.log_error(f"{self.name}: engine loop error: {exc}\n{traceback.format_exc()}")
        for job, _item in list(self.active.values()):
            self.server.fail(job, "the model is shutting down")
        for _ in range(100):  # let GenAI drop the stopped requests before the pipeline is destroyed
            if not self.pipeline.has_non_finished_requests():
                break
            try:
                self.pipeline.step()
            except Exception:
                break

    def _after_idle(self) -> None:
        """Requests arrived at an idle engine. If the previous idle spell ended with a burst (two or more requests
        within arrival_window_ms of the first, as a client starting N streams at once sends them), wait out the
        window so that this burst's prompts share one prefill step too; a client that sends one request at a time
        never waits. Whether this start is a burst is counted in _admit, for the next one."""
        if self.arrival_window_s <= 0:
            return
        bursty = self.burst_admitted >= 2
        self.burst_until, self.burst_admitted = time.monotonic() + self.arrival_window_s, len(self.active)
        if bursty:
            self._admit_until(self.burst_until, lambda: True)

    def _await_arrivals(self) -> None:
        """After a step that ended two or more requests, wait (at most arrival_window_ms from that step's end)
        until as many new requests have arrived. A client that keeps N requests in flight sends each successor as
        soon as a request ends; the successors reach this thread one by one over several ms, and a step that starts
        before all of them are here admits only some: GenAI's scheduler (chunked context off) runs a prompt-only
        step per group of arrivals, and every running request waits one whole step for each group."""
        self._admit_until(self.awaited_until, lambda: self.awaited > 0)
        self.awaited = 0

    def _admit_until(self, deadline: float, waiting: Callable[[], bool]) -> None:
        """Admit what arrives until `deadline` (time.monotonic()) while `waiting()` holds."""
        while waiting() and not self.stopping.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self._admit(block=True, timeout_s=left)

    def _admit(self, block: bool, timeout_s: float = IDLE_WAIT_S) -> None:
        try:
            entry = self.incoming.get(timeout=timeout_s) if block else self.incoming.get_nowait()
        except queue.Empty:
            return
        while True:
            if callable(entry):  # a control message (cancel, stop)
                entry()
            elif not entry.closed:
                try:
                    for item in entry.items:
                        item.engine_id = self.next_engine_id
                        self.next_engine_id += 1
                        item.handle = self.pipeline.add_request(item.engine_id, item.prompt, item.config)
                        item.first_scheduled_ns = time.time_ns()
                        self.active[item.engine_id] = (entry, item)
                        self.awaited -= 1
                        if time.monotonic() < self.burst_until:
                            self.burst_admitted += 1
                except Exception as exc:
                    self.server.fail(entry, f"the engine refused the request: {exc}".splitlines()[0])
            try:
                entry = self.incoming.get_nowait()
            except queue.Empty:
                return
