"""`LLM`: the CPU stand-in's engine. One background thread owns an OpenVINO GenAI ContinuousBatchingPipeline:
it admits requests, calls `step()`, reads each request's new tokens, detokenizes, applies stop strings and
publishes snapshots to the request's RequestOutput. Everything else talks to it through a queue."""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import queue
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any, cast

from trtllm_forge.llmapi_args import describe, unknown_keys
from trtllm_forge.llmapi_cpu.outputs import RequestOutput
from trtllm_forge.llmapi_cpu.sampling import SamplingParams
from trtllm_forge.model_repo_templates.cpu.tensorrt_llm.genai_settings import (
    CPU_KV_BLOCK_SIZE,
    IDLE_WAIT_S,
    default_eos_ids,
    kv_blocks_for,
    pipeline_properties,
    sampling_problem,
    scheduler_config,
    set_penalties,
    set_sampling,
)
from trtllm_forge.model_repo_templates.cpu.tensorrt_llm.kv_pool import warm_up_and_commit

# When set, the engine's counters are written to this JSON file after every change (tests read them from outside
# the Triton stub process to see that a vanished client really stopped the generation).
STATS_ENV = "TRTLLM_FORGE_STANDIN_STATS"
# LLM() arguments with a meaning on one CPU: anything else keeps NVIDIA's default or is refused below.
SINGLE_DEVICE = {"tensor_parallel_size": 1, "pipeline_parallel_size": 1, "context_parallel_size": 1, "max_beam_width": 1}


class RequestError(ValueError):
    """A request the stand-in refuses (too long, unsupported sampling); the other requests carry on."""


@dataclass
class _Request:
    output: RequestOutput
    params: SamplingParams
    prompt_ids: list[int]
    config: Any = None  # the GenAI GenerationConfig (openvino_genai is untyped)
    handle: Any = None  # its GenerationHandle
    tokens: list[int] = field(default_factory=list)
    aborted: bool = False
    # Wall-clock stamps (ns) for RequestPerfMetrics.timing_metrics.
    arrival_ns: int = field(default_factory=time.time_ns)
    first_scheduled_ns: int = 0
    first_token_ns: int = 0
    last_token_ns: int = 0


class LLM:
    """`tensorrt_llm.LLM` on CPU (stand-in). `model` is an OpenVINO IR directory written by `trtllm-forge build-engine`
    (openvino_model.xml, the engine config.json, HF tokenizer files)."""

    def __init__(self, model: str | Path, **llm_args: Any) -> None:
        problems = unknown_keys({"model": model, **llm_args})
        if problems:
            raise TypeError(describe(problems[0]))
        for key, value in SINGLE_DEVICE.items():
            if llm_args.get(key, value) not in (value, None):
                raise ValueError(f"{key}={llm_args[key]}: the CPU stand-in runs on one device; use {value}")
        if llm_args.get("speculative_config"):
            raise ValueError("speculative_config: the CPU stand-in does not decode speculatively; remove it")
        import openvino_genai as ov_genai
        from transformers import AutoTokenizer

        self.model_dir = Path(model)
        if not (self.model_dir / "openvino_model.xml").is_file():
            raise FileNotFoundError(
                f"{self.model_dir} holds no OpenVINO IR (openvino_model.xml); run `trtllm-forge build-engine` "
                "for an openvino llmapi config first"
            )
        engine = json.loads((self.model_dir / "config.json").read_text())
        build = engine.get("build_config", {})
        self.args = llm_args
        self.max_batch_size = int(llm_args.get("max_batch_size") or build.get("max_batch_size") or 8)
        self.max_seq_len = int(llm_args.get("max_seq_len") or build.get("max_seq_len") or 2048)
        self.max_input_len = int(llm_args.get("max_input_len") or build.get("max_input_len") or self.max_seq_len)
        self.vocab_size = int(engine.get("pretrained_config", {}).get("vocab_size", 0)) or None
        kv = dict(llm_args.get("kv_cache_config") or {})
        kv_tokens = int(kv.get("max_tokens") or self.max_batch_size * self.max_seq_len)
        scheduler = scheduler_config(
            ov_genai,
            kv_blocks=max(kv_blocks_for(kv_tokens), kv_blocks_for(self.max_seq_len)),  # at least one full sequence
            max_batch_size=self.max_batch_size,
            max_num_tokens=llm_args.get("max_num_tokens") or build.get("max_num_tokens"),
            max_input_len=self.max_input_len,
            prefix_caching=bool(kv.get("enable_block_reuse", True)),  # NVIDIA's KvCacheConfig default
            split_fuse=bool(llm_args.get("enable_chunked_prefill", False)),
        )
        properties = pipeline_properties(engine.get("openvino", {}).get("properties"))
        tokenizer_dir = llm_args.get("tokenizer") or self.model_dir
        self.tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir), trust_remote_code=bool(llm_args.get("trust_remote_code")))
        self.eos_token_id = self._eos(self.model_dir, self.tokenizer)
        self.pipeline = ov_genai.ContinuousBatchingPipeline(str(self.model_dir), scheduler, "CPU", properties)
        self.warm_up = warm_up_and_commit(self.pipeline, ov_genai, self.max_batch_size)
        self.ov_genai = ov_genai
        # The engine's own counters: what was admitted, finished, aborted and generated.
        self.stats = {"submitted": 0, "finished": 0, "aborted": 0, "failed": 0, "generated_tokens": 0, "active": 0}
        self._ids = itertools.count()
        self._inbox: queue.Queue = queue.Queue()
        self._active: dict[int, _Request] = {}
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="llmapi-cpu-engine", daemon=True)
        self._thread.start()

    @staticmethod
    def _eos(model_dir: Path, tokenizer: Any) -> int | None:
        """The model's first EOS id, else the tokenizer's."""
        eos = default_eos_ids(model_dir)
        return eos[0] if eos else tokenizer.eos_token_id

    # ------------------------------------------------------------------------------------------------
    # The API

    def generate_async(
        self, inputs: str | list[int], sampling_params: SamplingParams | None = None, streaming: bool = False
    ) -> RequestOutput:
        if self._stopping.is_set():
            raise RuntimeError("the LLM has been shut down")
        params = sampling_params or SamplingParams()
        if isinstance(inputs, str):
            prompt, ids = inputs, list(self.tokenizer(inputs, add_special_tokens=params.add_special_tokens)["input_ids"])
        else:
            prompt, ids = None, [int(t) for t in inputs]
        if not ids:
            raise RequestError("the prompt is empty")
        if len(ids) > self.max_input_len:
            raise RequestError(f"the prompt has {len(ids)} tokens, more than max_input_len {self.max_input_len}")
        if len(ids) >= self.max_seq_len:
            raise RequestError(f"a {len(ids)}-token prompt leaves no room within max_seq_len {self.max_seq_len}")
        output = RequestOutput(next(self._ids), prompt, ids, streaming, self._abort)
        request = _Request(output, params, ids, self._generation_config(params, len(ids)))
        self._inbox.put(("add", request))
        return output

    def generate(
        self, inputs: str | list[int] | list[str] | list[list[int]], sampling_params: SamplingParams | None = None
    ) -> RequestOutput | list[RequestOutput]:
        """Blocking: one RequestOutput per prompt (a list for a list of prompts)."""
        many = isinstance(inputs, list) and inputs and not isinstance(inputs[0], int)
        prompts = cast("list[str | list[int]]", inputs if many else [inputs])
        results = [self.generate_async(p, sampling_params) for p in prompts]
        done = [r.result() for r in results]
        return done if many else done[0]

    def shutdown(self) -> None:
        if self._stopping.is_set():
            return
        self._stopping.set()
        self._thread.join(timeout=30)

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # ------------------------------------------------------------------------------------------------
    # Engine thread

    def _abort(self, request_id: int) -> None:
        self._inbox.put(("abort", request_id))

    def _count(self, name: str) -> None:
        self.stats[name] += 1
        self.stats["active"] = len(self._active)
        path = os.environ.get(STATS_ENV)
        if path:
            tmp = f"{path}.tmp"
            with open(tmp, "w") as handle:
                json.dump(self.stats, handle)
            os.replace(tmp, path)

    def _generation_config(self, params: SamplingParams, prompt_len: int) -> Any:  # an openvino_genai.GenerationConfig
        config = self.ov_genai.GenerationConfig()
        config.max_new_tokens = min(params.max_tokens, self.max_seq_len - prompt_len)
        eos = params.end_id if params.end_id is not None else self.eos_token_id
        stop_ids = set(params.stop_token_ids or [])
        if params.ignore_eos or eos is None or (self.vocab_size and not 0 <= eos < self.vocab_size):
            config.ignore_eos = True
        else:
            config.eos_token_id = int(eos)
            stop_ids.add(int(eos))
        config.stop_token_ids = stop_ids
        if params.min_tokens:
            config.min_new_tokens = int(params.min_tokens)
        if params.greedy or params.temperature == 0.0:
            config.do_sample = False
        else:
            temperature = 1.0 if params.temperature is None else float(params.temperature)
            # TensorRT-LLM: seed None means the runtime default 0
            set_sampling(config, temperature, int(params.top_k or 0), float(params.top_p or 0.0), int(params.seed or 0))
        set_penalties(config, vars(params))
        problem = sampling_problem(config)
        if problem:
            raise RequestError(problem)
        return config

    def _loop(self) -> None:
        import numpy as np
        import openvino as ov

        while not self._stopping.is_set() or self._active:
            if self._stopping.is_set():
                for request in list(self._active.values()):
                    self._end(request, "cancelled", None)
            pending = self.pipeline.has_non_finished_requests()
            self._drain_inbox(ov, np, block=not self._active and not pending)
            if not self._active and not pending:
                continue
            try:
                self.pipeline.step()
            except Exception as exc:
                for request in list(self._active.values()):
                    self._fail(request, RuntimeError(f"engine step failed: {exc}"))
                time.sleep(IDLE_WAIT_S)
                continue
            for request in list(self._active.values()):
                try:
                    self._collect(request)
                except Exception as exc:
                    self._fail(request, exc)
        for _ in range(100):  # let GenAI drop stopped requests before the pipeline goes away
            if not self.pipeline.has_non_finished_requests():
                break
            self.pipeline.step()

    def _drain_inbox(self, ov: ModuleType, np: ModuleType, block: bool) -> None:
        try:
            entry = self._inbox.get(timeout=IDLE_WAIT_S) if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            kind, payload = entry
            if kind == "add":
                request = payload
                try:
                    ids = ov.Tensor(np.asarray([request.prompt_ids], dtype=np.int64))
                    request.handle = self.pipeline.add_request(request.output.request_id, ids, request.config)
                    request.first_scheduled_ns = time.time_ns()
                    self._active[request.output.request_id] = request
                    self._count("submitted")
                except Exception as exc:
                    request.output._publish("", [], None, None, RequestError(f"the engine refused the request: {exc}".splitlines()[0]))
            elif kind == "abort" and payload in self._active:
                self._end(self._active[payload], "cancelled", None)
            try:
                entry = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _collect(self, request: _Request) -> None:
        status = self.ov_genai.GenerationStatus
        handle = request.handle
        state = handle.get_status()
        new: list[int] = []
        if handle.can_read():
            for output in handle.read().values():
                new.extend(int(t) for t in output.generated_ids)
        if state == status.IGNORED:
            self._fail(request, RequestError("the request does not fit in the KV cache; raise kv_cache_config.max_tokens"))
            return
        request.tokens.extend(new)
        self.stats["generated_tokens"] += len(new)
        if new:
            request.last_token_ns = time.time_ns()
            request.first_token_ns = request.first_token_ns or request.last_token_ns
        text = self._decode(request.tokens, request.params)
        for stop in request.params.stop_strings:
            at = text.find(stop)
            if at >= 0:
                keep = at + len(stop) if request.params.include_stop_str_in_output else at
                self._end(request, "stop", stop, text[:keep])
                return
        if state in (status.FINISHED, status.STOP):
            last = request.tokens[-1] if request.tokens else None
            stops = set(request.config.stop_token_ids)
            if last is not None and last in stops and not request.config.ignore_eos:
                reason = last if last in (request.params.stop_token_ids or []) else None
                self._end(request, "stop", reason, text)
            else:
                self._end(request, "length", None, text)
        elif state == status.CANCEL:
            self._end(request, "cancelled", None, text)
        elif new and request.output.streaming and not text.endswith("\ufffd"):  # hold back half a UTF-8 character
            self._publish(request, text, None, None)

    def _decode(self, tokens: list[int], params: SamplingParams) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=params.skip_special_tokens) if params.detokenize else ""

    def _publish(self, request: _Request, text: str, finish_reason: str | None, stop_reason: int | str | None) -> None:
        tokens = request.tokens
        if not request.params.exclude_input_from_output:
            prompt = request.output.prompt if request.output.prompt is not None else self.tokenizer.decode(request.prompt_ids)
            text, tokens = prompt + text, request.prompt_ids + tokens
        request.output._publish(text, tokens, finish_reason, stop_reason, perf_metrics=self._perf(request))

    @staticmethod
    def _perf(request: _Request) -> SimpleNamespace | None:
        """RequestPerfMetrics' shape (kv_cache_metrics, timing_metrics, speculative_decoding) when asked for.
        The stand-in has no prefix reuse here: every block is newly allocated."""
        if not request.params.return_perf_metrics:
            return None
        from datetime import timedelta

        blocks = math.ceil((len(request.prompt_ids) + len(request.tokens)) / CPU_KV_BLOCK_SIZE)
        stamp = lambda ns: timedelta(microseconds=ns / 1000)  # noqa: E731
        return SimpleNamespace(
            kv_cache_metrics=SimpleNamespace(
                num_reused_blocks=0,
                num_missed_blocks=blocks,
                num_new_allocated_blocks=blocks,
                num_total_allocated_blocks=blocks,
                kv_cache_hit_rate=0.0,
            ),
            timing_metrics=SimpleNamespace(
                arrival_time=stamp(request.arrival_ns),
                first_scheduled_time=stamp(request.first_scheduled_ns),
                first_token_time=stamp(request.first_token_ns),
                last_token_time=stamp(request.last_token_ns),
            ),
            speculative_decoding=SimpleNamespace(acceptance_rate=0.0, total_accepted_draft_tokens=0, total_draft_tokens=0),
        )

    def _end(self, request: _Request, finish_reason: str, stop_reason: int | str | None, text: str | None = None) -> None:
        if self._active.pop(request.output.request_id, None) is None:
            return
        try:
            if request.handle.get_status() == self.ov_genai.GenerationStatus.RUNNING:
                request.handle.stop()
        except Exception:
            pass
        self._count("aborted" if finish_reason == "cancelled" else "finished")
        self._publish(request, self._decode(request.tokens, request.params) if text is None else text, finish_reason, stop_reason)

    def _fail(self, request: _Request, error: BaseException) -> None:
        if self._active.pop(request.output.request_id, None) is None:
            return
        with contextlib.suppress(Exception):
            request.handle.stop()
        self._count("failed")
        request.output._publish("", list(request.tokens), None, None, error)
