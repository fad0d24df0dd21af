#!/usr/bin/env python
"""The CPU engine against transformers, on one workload: 16 prompts x up to 64 new tokens, greedy.

Rows (output tokens per second; every generated token counts, EOS ends a sequence early):
  (a) transformers, one request at a time        (the reference for token identity)
  (b) transformers, statically batched (16, left padding)
  (c) our engine in-process: OpenVINO GenAI ContinuousBatchingPipeline with the settings the Triton
      `tensorrt_llm` model uses (scheduler from the engine config.json and the config's runtime section)
  (d) the same engine behind a real Triton, through the rendered ensemble (text in, text out), 16 requests at
      once, not streamed (like (c)); (d-stream) the same streamed, one response per token through
      postprocessing; (d') the `tensorrt_llm` model of that server called directly with token ids, streamed
for fp32 and int8 weights, plus the perplexity of each engine on a local text (int8 vs fp32).

    python scripts/bench_cpu_engine.py [--config configs/smollm2-cpu.yaml] [--root forge-work/bench-cpu]
        [--checkpoint DIR] [--precisions fp32,int8] [--skip-triton] [--json out.json] [--markdown out.md]
        [--note "what else ran"]

Engines are built (and cached) under --root with the project's own stages; nothing is downloaded.
Writes results/bench_cpu_engine/cpu_engine.json (git commit, machine with its load average and measured
bandwidth, every row); `scripts/readme_tables.py` renders the README table from that file (`render_table`).
"Identical" compares each method's output with (a), the reference, which is itself not judged; the token
counts are the tokens each method produced (the served rows count what the server says it sent).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import queue as queue_mod
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from trtllm_forge.model_repo_templates.cpu.tensorrt_llm.genai_settings import kv_blocks_for, pipeline_properties, scheduler_config
from trtllm_forge.model_repo_templates.cpu.tensorrt_llm.kv_pool import warm_up_and_commit

from trtllm_forge.bench import provenance
from trtllm_forge.sample_prompts import PROMPTS  # the same 16 prompts the engine tests use
from trtllm_forge.verify.reference import default_text

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "results" / "bench_cpu_engine" / "cpu_engine.json"
CONCURRENCY_RESULTS = REPO / "results" / "bench_cpu_engine" / "concurrency.json"
README_MARKER = "cpu-engine-table"
# The short local text verify uses for perplexity (shipped with trtllm-forge; nothing is downloaded).
PERPLEXITY_TEXT = default_text()[0]


@dataclass
class Row:
    key: str
    method: str
    precision: str
    tokens: int
    seconds: float
    identical: int | None = None  # prompts whose output equals (a)'s; None for (a) itself, the reference
    total: int = len(PROMPTS)
    note: str = ""
    outputs: list[list[int]] = field(default_factory=list, repr=False)

    @property
    def tok_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


def info(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ---- transformers ---------------------------------------------------------------------------------------


def load_transformers(checkpoint: Path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(checkpoint))
    model = AutoModelForCausalLM.from_pretrained(str(checkpoint), dtype=torch.float32).eval()
    return tokenizer, model


def eos_ids(model) -> set[int]:
    eos = model.generation_config.eos_token_id
    return set(eos if isinstance(eos, list) else [eos]) if eos is not None else set()


def trim_at_eos(ids: list[int], eos: set[int]) -> list[int]:
    for i, t in enumerate(ids):
        if t in eos:
            return ids[: i + 1]
    return ids


def run_transformers_sequential(model, prompt_ids, max_tokens) -> Row:
    import torch

    outputs = []
    started = time.perf_counter()
    with torch.no_grad():
        for ids in prompt_ids:
            out = model.generate(
                torch.tensor([ids]),
                attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                max_new_tokens=max_tokens,
                do_sample=False,
                pad_token_id=model.config.eos_token_id,
            )
            outputs.append(out[0, len(ids) :].tolist())
    seconds = time.perf_counter() - started
    return Row(
        "a", "transformers, one request at a time", "fp32", sum(map(len, outputs)), seconds, None, note="the reference", outputs=outputs
    )


def median_run(fn, repeats: int):
    """Run fn() `repeats` times and keep the run with the median throughput."""
    runs = sorted((fn() for _ in range(repeats)), key=lambda r: r.tok_s)
    chosen = runs[len(runs) // 2]
    if repeats > 1:
        chosen.note = (chosen.note + f" median of {repeats}: " + "/".join(f"{r.tok_s:.0f}" for r in runs)).strip()
    return chosen


def run_transformers_batched(model, prompt_ids, max_tokens, reference) -> Row:
    import torch

    pad = model.config.pad_token_id if model.config.pad_token_id is not None else model.config.eos_token_id
    width = max(map(len, prompt_ids))
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompt_ids])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompt_ids])
    started = time.perf_counter()
    with torch.no_grad():
        out = model.generate(ids, attention_mask=mask, max_new_tokens=max_tokens, do_sample=False, pad_token_id=pad)
    seconds = time.perf_counter() - started
    eos = eos_ids(model)
    outputs = [trim_at_eos(row[width:].tolist(), eos) for row in out]
    same = sum(o == r for o, r in zip(outputs, reference, strict=False))
    return Row(
        "b",
        f"transformers, static batch of {len(prompt_ids)}",
        "fp32",
        sum(map(len, outputs)),
        seconds,
        same,
        note="left padding",
        outputs=outputs,
    )


def transformers_nll(model, tokenizer) -> tuple[float, int]:
    import torch

    ids = tokenizer(PERPLEXITY_TEXT, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        logits = model(ids).logits[0, :-1].double()
    targets = ids[0, 1:]
    nll = torch.nn.functional.cross_entropy(logits, targets, reduction="sum").item()
    return nll, int(targets.numel())


# ---- the engine in-process -------------------------------------------------------------------------------


def scheduler_for(config, engine_dir: Path):
    """The SchedulerConfig and properties the CPU `tensorrt_llm` model builds from the same inputs."""
    import openvino_genai as ov_genai

    engine = json.loads((engine_dir / "config.json").read_text())
    build = engine["build_config"]
    kv_tokens = config.runtime.max_tokens_in_paged_kv_cache or build["max_batch_size"] * build["max_seq_len"]
    scheduler = scheduler_config(
        ov_genai,
        kv_blocks=kv_blocks_for(kv_tokens),
        max_batch_size=build["max_batch_size"],
        max_num_tokens=build.get("max_num_tokens"),
        max_input_len=build["max_input_len"],
        prefix_caching=config.runtime.enable_kv_cache_reuse,
        split_fuse=config.runtime.enable_chunked_context,
    )
    return scheduler, pipeline_properties(engine.get("openvino", {}).get("properties"))


def run_engine_in_process(config, engine_dir: Path, prompt_ids, max_tokens, reference, precision: str, repeats: int = 1) -> Row:
    import numpy as np
    import openvino as ov
    import openvino_genai as ov_genai

    scheduler, properties = scheduler_for(config, engine_dir)
    pipeline = ov_genai.ContinuousBatchingPipeline(str(engine_dir), scheduler, "CPU", properties)
    print(
        f"  engine in-process: {warm_up_and_commit(pipeline, ov_genai, scheduler.max_num_seqs)}", file=sys.stderr
    )  # as the engine model does

    def generation_config(n: int):
        gc = ov_genai.GenerationConfig()
        gc.max_new_tokens = n
        gc.do_sample = False
        eos = json.loads((engine_dir / "generation_config.json").read_text()).get("eos_token_id")
        if eos is not None:
            gc.eos_token_id = eos[0] if isinstance(eos, list) else eos
            gc.stop_token_ids = set(eos if isinstance(eos, list) else [eos])
        return gc

    def run(batch, n):
        handles = [
            pipeline.add_request(i, ov.Tensor(np.asarray([ids], dtype=np.int64)), generation_config(n)) for i, ids in enumerate(batch)
        ]
        outputs: list[list[int]] = [[] for _ in batch]
        while pipeline.has_non_finished_requests():
            pipeline.step()
            for i, handle in enumerate(handles):
                if handle.can_read():
                    for out in handle.read().values():
                        outputs[i].extend(int(t) for t in out.generated_ids)
        for i, handle in enumerate(handles):  # tokens of the last step
            if handle.can_read():
                for out in handle.read().values():
                    outputs[i].extend(int(t) for t in out.generated_ids)
        return outputs

    run(prompt_ids[:2], 4)  # warm-up: first inference compiles kernels

    def once() -> Row:
        started = time.perf_counter()
        outputs = run(prompt_ids, max_tokens)
        seconds = time.perf_counter() - started
        same = sum(o == r for o, r in zip(outputs, reference, strict=False))
        return Row(
            "c", "our engine in-process (ContinuousBatchingPipeline)", precision, sum(map(len, outputs)), seconds, same, outputs=outputs
        )

    return median_run(once, repeats)


def run_onnxruntime_in_process(
    config, workdir: Path, checkpoint: Path, prompt_ids, max_tokens, reference, precision: str, repeats: int
) -> Row:
    """(c-ort) the second CPU engine: ONNX Runtime GenAI, built by builders/onnxruntime and driven through the same
    adapter (model_repo_templates/cpu/tensorrt_llm/ort_engine.py) and calls as (c)."""
    from trtllm_forge.builders.onnxruntime.builder import build_engine as build_onnxruntime

    data = config.model_dump(mode="json")
    data["engine"]["backend"] = "onnxruntime"
    data["engine"]["speculative"] = {"mode": "none"}
    data["runtime"].update({"enable_kv_cache_reuse": False, "enable_chunked_context": False})
    ort_config = type(config).model_validate({**data, "config_dir": str(config.config_dir)})
    engine_dir = build_onnxruntime(ort_config, workdir, checkpoint).engine_dir
    assert engine_dir is not None  # an engine-target build
    sys.path.insert(0, str(REPO / "model_repo_templates" / "cpu" / "tensorrt_llm"))
    import ort_engine

    pipeline = ort_engine.ContinuousBatchingPipeline(str(engine_dir), ort_engine.SchedulerConfig(max_num_seqs=len(prompt_ids)))
    eos = json.loads((engine_dir / "generation_config.json").read_text()).get("eos_token_id")
    eos_list = eos if isinstance(eos, list) else [eos]

    def run(batch, n):
        configs = [ort_engine.GenerationConfig(max_new_tokens=n, eos_token_id=eos_list[0], stop_token_ids=set(eos_list)) for _ in batch]
        handles = [pipeline.add_request(i, ids, c) for i, (ids, c) in enumerate(zip(batch, configs, strict=False))]
        outputs: list[list[int]] = [[] for _ in batch]
        while pipeline.has_non_finished_requests():
            pipeline.step()
            for i, handle in enumerate(handles):
                if handle.can_read():
                    outputs[i].extend(handle.read()[0].generated_ids)
        return outputs

    run(prompt_ids[:2], 4)  # warm-up

    def once() -> Row:
        started = time.perf_counter()
        outputs = run(prompt_ids, max_tokens)
        seconds = time.perf_counter() - started
        same = sum(o == r for o, r in zip(outputs, reference, strict=False))
        return Row(
            "c-ort",
            "ONNX Runtime GenAI in-process (Engine, static batch)",
            precision,
            sum(map(len, outputs)),
            seconds,
            same,
            outputs=outputs,
        )

    return median_run(once, repeats)


def engine_nll(engine_dir: Path, tokenizer) -> tuple[float, int]:
    """Negative log-likelihood of PERPLEXITY_TEXT under the exported IR (one forward pass, f32 hints)."""
    import numpy as np
    import openvino as ov

    engine = json.loads((engine_dir / "config.json").read_text())
    properties = engine.get("openvino", {}).get("properties") or {}
    core = ov.Core()
    compiled = core.compile_model(
        str(engine_dir / "openvino_model.xml"), "CPU", {k: v for k, v in properties.items() if k == "INFERENCE_PRECISION_HINT"}
    )
    request = compiled.create_infer_request()
    ids = np.asarray([tokenizer(PERPLEXITY_TEXT)["input_ids"]], dtype=np.int64)
    names = {port.any_name for port in compiled.inputs}
    feed = {"input_ids": ids}
    if "attention_mask" in names:
        feed["attention_mask"] = np.ones_like(ids)
    if "position_ids" in names:
        feed["position_ids"] = np.arange(ids.shape[1], dtype=np.int64)[None, :]
    if "beam_idx" in names:
        feed["beam_idx"] = np.zeros(1, dtype=np.int32)
    request.reset_state()
    logits = request.infer(feed)[compiled.output("logits")][0, :-1].astype(np.float64)
    targets = ids[0, 1:]
    logits -= logits.max(axis=-1, keepdims=True)
    log_probs = logits - np.log(np.exp(logits).sum(axis=-1, keepdims=True))
    nll = -float(log_probs[np.arange(len(targets)), targets].sum())
    return nll, len(targets)


# ---- through Triton --------------------------------------------------------------------------------------


def concurrent(fn, items):
    with ThreadPoolExecutor(max_workers=len(items)) as pool:
        started = time.perf_counter()
        results = list(pool.map(fn, items))
        return results, time.perf_counter() - started


def run_triton(
    config, workdir: Path, engine_dir: Path, prompt_ids, max_tokens, reference, tokenizer, precision: str, repeats: int = 1
) -> list[Row]:
    from trtllm_forge.client import _text_of as text_of
    from trtllm_forge.client import generate, stream_request
    from trtllm_forge.deploy import start_server, stop_server
    from trtllm_forge.render.repository import render_repository

    render_repository(config, workdir, engine_dir)
    deployment = start_server(config, workdir)
    names = config.triton.model_names
    try:
        # warm-up (both paths), then the measured runs
        generate(deployment, PROMPTS[0], 4, model=names.ensemble)

        def text_request(prompt: str, stream: bool):
            values = {"text_input": prompt, "max_tokens": max_tokens, "stream": stream, "return_num_output_tokens": True}
            return stream_request(deployment, names.ensemble, values)

        def by_text(stream: bool) -> Row:
            results, seconds = concurrent(lambda p: text_request(p, stream), PROMPTS)
            # The ensemble returns text: a prompt counts as identical when the served text equals the
            # detokenized reference. Tokens are what the server reports it produced (num_output_tokens),
            # never the reference's count.
            same, tokens = 0, 0
            for result, ref in zip(results, reference, strict=False):
                if result.error:
                    raise RuntimeError(f"ensemble request failed: {result.error}")
                text = "".join(text_of(r.get("text_output")) for r in result.responses)
                # num_output_tokens is the running count of the request's tokens (streamed: one more per response)
                tokens += max((int(r["num_output_tokens"].max()) for r in result.responses if "num_output_tokens" in r), default=0)
                if text in (
                    tokenizer.decode(ref, skip_special_tokens=True),
                    "".join(tokenizer.decode([t], skip_special_tokens=True) for t in ref),
                ):
                    same += 1
            if stream:
                return Row(
                    "d-stream",
                    "Triton ensemble, streamed (text, one response per token)",
                    precision,
                    tokens,
                    seconds,
                    same,
                    note="identity judged on the text",
                )
            return Row("d", "Triton ensemble, not streamed (text)", precision, tokens, seconds, same, note="identity judged on the text")

        def ids(ids_):
            values = {"input_ids": ids_, "input_lengths": [len(ids_)], "request_output_len": [max_tokens], "streaming": [True]}
            return stream_request(deployment, names.tensorrt_llm, values)

        def by_ids() -> Row:
            results, seconds = concurrent(ids, prompt_ids)
            outputs = [[int(t) for r in res.responses for t in r["output_ids"].reshape(-1)] for res in results]
            same = sum(o == r for o, r in zip(outputs, reference, strict=False))
            return Row(
                "d'", "Triton tensorrt_llm model, streamed (token ids)", precision, sum(map(len, outputs)), seconds, same, outputs=outputs
            )

        return [median_run(lambda: by_text(False), repeats), median_run(lambda: by_text(True), repeats), median_run(by_ids, repeats)]
    finally:
        stop_server(deployment)


# ---- closed loop at several concurrencies: served against in-process (issue 16.1) -------------------------

LOAD_PATHS = ("in-process", "served", "served-stream", "served-stream-tritonclient", "served-stream-engine-model")
LOAD_PATH_LABELS = {
    "in-process": "engine in-process (ContinuousBatchingPipeline, same scheduler)",
    "served": "Triton ensemble, not streamed",
    "served-stream": "Triton ensemble, streamed",
    "served-stream-tritonclient": "Triton ensemble, streamed, read by tritonclient's stream API",
    "served-stream-engine-model": "Triton `tensorrt_llm` model (token ids), streamed",
}
# CPU seconds of each process role over one closed-loop run (LoadPoint.cpu_s): this script's own process (the engine
# on the in-process path, the client on the served ones), tritonserver itself, the engine model's python stub and the
# other stubs (pre/postprocessing, BLS).
CPU_ROLES = ("bench_process", "tritonserver", "engine_stub", "other_stubs")
# The streamed goal is measured with trtllm-forge's own gRPC client (the bench's): the client runs on the same two
# cores as the engine, and tritonclient's stream API spends several times its CPU per response (the
# served-stream-tritonclient path, kept to show that cost); the in-process baseline has no client at all.
GOAL_PATHS = ("served", "served-stream")


@dataclass
class LoadPoint:
    """One closed-loop run: `concurrency` clients, each sending its next request when the last one ended."""

    path: str
    concurrency: int
    repeat: int
    requests: int
    tokens: int
    seconds: float
    identical: int  # requests whose output equals the in-process output for the same prompt
    errors: int = 0
    load_average_after: float = 0.0
    cpu_s: dict[str, float] = field(default_factory=dict)  # CPU_ROLES -> CPU seconds over the run

    @property
    def tok_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


def cpu_by_role(deployment, engine_model: str) -> dict[str, float]:
    """CPU seconds used so far by each of CPU_ROLES (the stubs are found in the server's process group)."""
    from trtllm_forge.processes import cpu_seconds, group_members

    times = os.times()
    roles = dict.fromkeys(CPU_ROLES, 0.0)
    roles["bench_process"] = times.user + times.system
    for pid in group_members(deployment.pgid):
        seconds = cpu_seconds(pid)
        if seconds is None:
            continue
        if pid == deployment.pid:
            roles["tritonserver"] += seconds
            continue
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        # a stub's first argument is its model.py: <repository>/<model>/<version>/model.py
        stub_model = Path(argv[1].decode(errors="replace")).parent.parent.name if len(argv) > 1 else ""
        roles["engine_stub" if stub_model == engine_model else "other_stubs"] += seconds
    return roles


def open_pipeline(config, engine_dir: Path):
    """The pipeline the CPU `tensorrt_llm` model builds, and a GenerationConfig maker with its EOS handling."""
    import openvino_genai as ov_genai

    scheduler, properties = scheduler_for(config, engine_dir)
    pipeline = ov_genai.ContinuousBatchingPipeline(str(engine_dir), scheduler, "CPU", properties)
    print(
        f"  engine in-process: {warm_up_and_commit(pipeline, ov_genai, scheduler.max_num_seqs)}", file=sys.stderr
    )  # as the engine model does
    eos = json.loads((engine_dir / "generation_config.json").read_text()).get("eos_token_id")
    eos_list = (eos if isinstance(eos, list) else [eos]) if eos is not None else []

    def generation_config(n: int):
        gc = ov_genai.GenerationConfig()
        gc.max_new_tokens = n
        gc.do_sample = False
        if eos_list:
            gc.eos_token_id = eos_list[0]
            gc.stop_token_ids = set(eos_list)
        return gc

    return pipeline, generation_config


def closed_loop_in_process(pipeline, generation_config, prompt_ids, order: list[int], concurrency: int, max_tokens: int):
    """Keep `concurrency` requests in the pipeline until every prompt index in `order` ran; one thread adds,
    steps and reads, as the CPU engine model's loop does. Returns (outputs by position in `order`, seconds)."""
    import numpy as np
    import openvino as ov

    outputs: list[list[int]] = [[] for _ in order]
    active: dict[int, Any] = {}  # position -> GenAI generation handle
    next_position = 0
    started = time.perf_counter()
    while next_position < len(order) or active:
        while len(active) < concurrency and next_position < len(order):
            ids = ov.Tensor(np.asarray([prompt_ids[order[next_position]]], dtype=np.int64))
            active[next_position] = pipeline.add_request(next_position, ids, generation_config(max_tokens))
            next_position += 1
        pipeline.step()
        for position, handle in list(active.items()):
            if handle.can_read():
                for out in handle.read().values():
                    outputs[position].extend(int(t) for t in out.generated_ids)
            if handle.get_status().name != "RUNNING":
                if handle.can_read():
                    for out in handle.read().values():
                        outputs[position].extend(int(t) for t in out.generated_ids)
                del active[position]
    return outputs, time.perf_counter() - started


def closed_loop_served(grpc_url: str, model: str, prompts: list[str], order: list[int], concurrency: int, max_tokens: int, stream: bool):
    """`concurrency` client threads, each on its own gRPC stream (opened before the clock starts), each sending
    the next prompt of `order` when its last request ended. Returns ([(text, tokens) or error] by position, seconds)."""
    import threading

    import tritonclient.grpc as grpcclient

    from trtllm_forge.client import _input_specs, _text_of, make_inputs

    results: list = [None] * len(order)
    lock = threading.Lock()
    cursor = [0]
    clients = []
    for _ in range(concurrency):
        client = grpcclient.InferenceServerClient(url=grpc_url)
        inbox: queue_mod.Queue = queue_mod.Queue()
        client.start_stream(callback=lambda result=None, error=None, inbox=inbox: inbox.put((result, error)))
        clients.append((client, inbox))
    max_batch, specs = _input_specs(clients[0][0], model)
    values = [{"text_input": p, "max_tokens": max_tokens, "stream": stream, "return_num_output_tokens": True} for p in prompts]
    go = threading.Barrier(concurrency + 1)

    def worker(client, inbox) -> None:
        go.wait()
        while True:
            with lock:
                position = cursor[0]
                cursor[0] += 1
            if position >= len(order):
                return
            inputs = make_inputs(values[order[position]], specs, batched=max_batch > 0)
            client.async_stream_infer(model, inputs, request_id=f"c{position}", enable_empty_final_response=True)
            text, tokens = [], 0
            while True:
                result, error = inbox.get(timeout=600)
                if error is not None:
                    results[position] = f"error: {error}"
                    break
                payload = result.get_response()
                for out in payload.outputs:
                    if out.name == "text_output":
                        text.append(_text_of(result.as_numpy("text_output")))
                    elif out.name == "num_output_tokens":
                        tokens = max(tokens, int(result.as_numpy("num_output_tokens").max()))
                final = payload.parameters.get("triton_final_response")
                if final is not None and final.bool_param:
                    results[position] = ("".join(text), tokens)
                    break

    threads = [threading.Thread(target=worker, args=pair, daemon=True) for pair in clients]
    for thread in threads:
        thread.start()
    go.wait()
    started = time.perf_counter()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - started
    for client, _ in clients:
        with contextlib.suppress(Exception):
            client.stop_stream()
        client.close()
    return results, seconds


def closed_loop_on_target(target, requests: list, records: list, concurrency: int) -> float:
    """`concurrency` workers on one of the bench's targets, each sending the next of `requests` (with its record)
    when its last one ended; returns the seconds from the first send to the last end."""
    import asyncio

    async def main() -> float:
        await target.open()
        cursor = iter(range(len(requests)))

        async def worker() -> None:
            for position in cursor:
                await target.send(requests[position], records[position])

        try:
            started = time.perf_counter()
            await asyncio.gather(*(worker() for _ in range(concurrency)))
            return time.perf_counter() - started
        finally:
            await target.close()

    return asyncio.run(main())


def closed_loop_served_forge(grpc_url: str, model: str, prompts: list[str], order: list[int], concurrency: int, max_tokens: int):
    """closed_loop_served's streamed loop through trtllm-forge's own gRPC client (bench's TritonGrpcTarget: a
    persistent stream per client, responses read off the hot path): the same requests (max_tokens, no forced
    length), the same result shape."""
    from trtllm_forge.bench.records import RequestRecord
    from trtllm_forge.bench.target_grpc import TritonGrpcTarget
    from trtllm_forge.bench.workload import BenchRequest

    records = [RequestRecord(f"c{i}", "measure", 0, 0, "requested", max_tokens, texts=[]) for i in range(len(order))]
    requests = [BenchRequest(prompts[i], None, 0, "requested", max_tokens) for i in order]
    target = TritonGrpcTarget(grpc_url, model, force_output_len=False, streams=concurrency)
    seconds = closed_loop_on_target(target, requests, records, concurrency)
    target.count_client_tokens(records)
    results: list = [("".join(r.texts or []), r.output_tokens) if r.ok else f"error: {r.error_message}" for r in records]
    return results, seconds


def closed_loop_served_engine_model(grpc_url: str, model: str, prompt_ids, order: list[int], concurrency: int, max_tokens: int):
    """The streamed closed loop on the `tensorrt_llm` model itself, token ids in and out, through trtllm-forge's own
    gRPC client (the bench's token-id target): what the ensemble's pre/postprocessing add to streaming is the
    difference to the served-stream path. Returns ([(output ids, tokens) or error] by position, seconds)."""
    import numpy as np

    from trtllm_forge.bench.records import RequestRecord
    from trtllm_forge.bench.target_grpc import TritonGrpcTokensTarget
    from trtllm_forge.bench.workload import BenchRequest

    ids_of: dict[str, list[int]] = {}

    class IdsKept(TritonGrpcTokensTarget):
        def parse_response(self, response, record: RequestRecord) -> bool:
            for output, raw in zip(response.outputs, response.raw_output_contents, strict=False):
                if output.name == "output_ids":
                    ids_of.setdefault(record.id, []).extend(int(t) for t in np.frombuffer(raw, dtype=np.int32))
            return super().parse_response(response, record)

    records = [RequestRecord(f"c{i}", "measure", 0, 0, "requested", max_tokens) for i in range(len(order))]
    requests = [BenchRequest("", tuple(prompt_ids[i]), len(prompt_ids[i]), "dataset_ids", max_tokens) for i in order]
    target = IdsKept(grpc_url, model, force_output_len=False, streams=concurrency)
    seconds = closed_loop_on_target(target, requests, records, concurrency)
    results: list = [(ids_of.get(r.id, []), r.output_tokens) if r.ok else f"error: {r.error_message}" for r in records]
    return results, seconds


def run_concurrency(args, base, root: Path, checkpoint: Path) -> dict:
    """Served (ensemble, streamed and not) against the same engine in-process, closed loop at each concurrency,
    the paths back to back per repeat and concurrency (order rotated per repeat)."""
    from transformers import AutoTokenizer
    from trtllm_forge.builders.openvino.builder import build_engine

    from trtllm_forge.deploy import start_server, stop_server
    from trtllm_forge.render.repository import render_repository

    document = provenance.record()
    document["schema"] = "trtllm-forge.bench-cpu-engine-concurrency/3"
    tokenizer = AutoTokenizer.from_pretrained(str(checkpoint))
    prompt_ids = [tokenizer(p)["input_ids"] for p in PROMPTS]
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    precision = next(p.strip() for p in args.precisions.split(",") if p.strip())
    config = precision_config(base, precision)
    workdir = root / precision
    engine_dir = build_engine(config, workdir, checkpoint).engine_dir
    assert engine_dir is not None  # an engine-target build
    pipeline, generation_config = open_pipeline(config, engine_dir)
    closed_loop_in_process(pipeline, generation_config, prompt_ids, list(range(len(PROMPTS))), len(PROMPTS), 4)  # compile kernels
    # The engine's own output per prompt: what every path must reproduce (greedy).
    expected_ids, _ = closed_loop_in_process(
        pipeline, generation_config, prompt_ids, list(range(len(PROMPTS))), len(PROMPTS), args.max_tokens
    )
    texts_of = [
        {tokenizer.decode(ids, skip_special_tokens=True), "".join(tokenizer.decode([t], skip_special_tokens=True) for t in ids)}
        for ids in expected_ids
    ]
    ids_as_served = [[ids] for ids in expected_ids]  # what the token-id path must return per prompt
    render_repository(config, workdir, engine_dir)
    deployment = start_server(config, workdir)
    points: list[LoadPoint] = []
    try:
        names = config.triton.model_names
        for stream in (False, True):  # warm-up of the served paths at the highest concurrency
            closed_loop_served(deployment.grpc_url, names.ensemble, PROMPTS, list(range(max(concurrencies))), max(concurrencies), 4, stream)
        closed_loop_served_forge(deployment.grpc_url, names.ensemble, PROMPTS, list(range(max(concurrencies))), max(concurrencies), 4)
        for repeat in range(args.repeats):
            for concurrency in concurrencies:
                requests = max(args.min_requests, 2 * concurrency)
                order = [i % len(PROMPTS) for i in range(requests)]
                paths = LOAD_PATHS[repeat % len(LOAD_PATHS) :] + LOAD_PATHS[: repeat % len(LOAD_PATHS)]
                for path in paths:
                    cpu_before = cpu_by_role(deployment, names.tensorrt_llm)
                    if path == "in-process":
                        outputs, seconds = closed_loop_in_process(
                            pipeline, generation_config, prompt_ids, order, concurrency, args.max_tokens
                        )
                        same = sum(out == expected_ids[i] for out, i in zip(outputs, order, strict=False))
                        point = LoadPoint(path, concurrency, repeat, requests, sum(map(len, outputs)), seconds, same)
                    else:
                        if path == "served-stream-engine-model":
                            results, seconds = closed_loop_served_engine_model(
                                deployment.grpc_url, names.tensorrt_llm, prompt_ids, order, concurrency, args.max_tokens
                            )
                        elif path == "served-stream":
                            results, seconds = closed_loop_served_forge(
                                deployment.grpc_url, names.ensemble, PROMPTS, order, concurrency, args.max_tokens
                            )
                        else:
                            results, seconds = closed_loop_served(
                                deployment.grpc_url, names.ensemble, PROMPTS, order, concurrency, args.max_tokens, path != "served"
                            )
                        accepted = ids_as_served if path == "served-stream-engine-model" else texts_of
                        good = [(r, i) for r, i in zip(results, order, strict=False) if isinstance(r, tuple)]
                        same = sum(r[0] in accepted[i] for r, i in good)
                        point = LoadPoint(
                            path, concurrency, repeat, requests, sum(r[1] for r, _ in good), seconds, same, errors=requests - len(good)
                        )
                    point.load_average_after = os.getloadavg()[0]
                    cpu_after = cpu_by_role(deployment, names.tensorrt_llm)
                    point.cpu_s = {role: round(cpu_after[role] - cpu_before[role], 3) for role in CPU_ROLES}
                    points.append(point)
                    info(f"    r{repeat} c{concurrency} {path}: {point.tok_s:.1f} tok/s, {point.identical}/{requests} identical")
    finally:
        stop_server(deployment)
    document["workload"] = {
        "precision": precision,
        "max_tokens": args.max_tokens,
        "prompts": len(PROMPTS),
        "concurrency": concurrencies,
        "repeats": args.repeats,
        "closed_loop": "each client sends its next prompt when its last request ended; same prompts and order on every path",
    }
    document["points"] = [{**asdict(p), "tok_s": p.tok_s} for p in points]
    document["goals"] = concurrency_goals(document)
    if args.note:
        document["note"] = args.note
    return provenance.finish(document)


def _paired(points: list[dict], concurrency: int, path: str, value: Callable[[dict], float | None]) -> list[tuple[float, float]]:
    """(in-process value, `path`'s value) of each repeat that has both (the two ran back to back), in run order; a
    repeat whose in-process value is missing or zero is left out."""

    def by_repeat(name: str) -> dict[int, float]:
        return {p["repeat"]: v for p in points if p["concurrency"] == concurrency and p["path"] == name and (v := value(p)) is not None}

    base = by_repeat("in-process")
    return [(base[repeat], v) for repeat, v in by_repeat(path).items() if base.get(repeat)]


def _paired_ratios(points: list[dict], concurrency: int, path: str) -> list[float]:
    """served ÷ in-process throughput of the same repeat."""
    return [served / base for base, served in _paired(points, concurrency, path, lambda p: p["tok_s"])]


def concurrency_goals(document: dict) -> list[str]:
    goals = []
    for concurrency in document["workload"]["concurrency"]:
        for path in GOAL_PATHS:
            ratios = _paired_ratios(document["points"], concurrency, path)
            if ratios:
                ratio = statistics.median(ratios)
                verdict = "PASS" if ratio >= 0.95 else "MISS"
                if ratio > 1.05:  # the served path runs the same engine plus more work: the baseline was slowed
                    verdict = "UNSETTLED (served more than 5% above in-process: the baseline, not serving, is off; rerun on a quiet host)"
                goals.append(f"{verdict}: concurrency {concurrency}, {LOAD_PATH_LABELS[path]} >= 95% of in-process ({ratio * 100:.1f}%)")
    return goals


def cpu_ms_per_token(point: dict) -> dict[str, float] | None:
    """A point's CPU per output token (ms) by what did the work: the engine (in-process: this script's process;
    served: the engine model's stub), serving (tritonserver and the other stubs) and the client."""
    cpu, tokens = point.get("cpu_s"), point["tokens"]
    if not cpu or not tokens:
        return None
    per = {role: cpu[role] * 1e3 / tokens for role in CPU_ROLES}
    if point["path"] == "in-process":
        return {"engine": per["bench_process"], "serving": 0.0, "client": 0.0}
    return {"engine": per["engine_stub"], "serving": per["tritonserver"] + per["other_stubs"], "client": per["bench_process"]}


def _cpu_total(point: dict) -> float | None:
    """All CPU ms per output token of a point (engine, serving and client)."""
    parts = cpu_ms_per_token(point)
    return sum(parts.values()) if parts else None


def _cpu_cells(points: list[dict], concurrency: int, path: str) -> tuple[str, str]:
    """(engine / serving / client CPU ms per token, in-process CPU ÷ this path's CPU per token), medians over repeats."""
    rows = [c for p in points if p["concurrency"] == concurrency and p["path"] == path if (c := cpu_ms_per_token(p))]
    if not rows:
        return "—", "—"
    medians = {part: statistics.median(r[part] for r in rows) for part in ("engine", "serving", "client")}
    cells = " / ".join(f"{medians[part]:.2f}" for part in ("engine", "serving", "client"))
    if path == "in-process":
        return cells, "—"
    shares = [base / served for base, served in _paired(points, concurrency, path, _cpu_total)]
    return cells, (f"{statistics.median(shares) * 100:.0f}%" if shares else "—")


def render_concurrency_table(document: dict) -> str:
    """The README table of the closed-loop run, from its result file alone."""
    workload = document["workload"]
    points = document["points"]
    lines = [
        f"Closed loop, {workload['precision']}, the {workload['prompts']} prompts in turn, greedy, up to {workload['max_tokens']} new tokens; "
        f"the paths back to back per concurrency and repeat (order rotated), {workload['repeats']} repeats, medians. "
        + provenance.measured_where(document),
        "",
        "| concurrency | path | output tok/s | served ÷ in-process (per repeat) | CPU ms per token: engine / serving / client "
        "| in-process CPU ÷ this path's CPU per token | outputs identical to in-process |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    for concurrency in workload["concurrency"]:
        for path in LOAD_PATHS:
            rows = [p for p in points if p["concurrency"] == concurrency and p["path"] == path]
            if not rows:
                continue
            tok_s = statistics.median(p["tok_s"] for p in rows)
            if path == "in-process":
                ratio = "—"
            else:
                ratios = _paired_ratios(points, concurrency, path)
                ratio = f"{statistics.median(ratios) * 100:.1f}% ({', '.join(f'{r * 100:.0f}' for r in ratios)})" if ratios else "—"
            cpu, cpu_share = _cpu_cells(points, concurrency, path)
            same = f"{sum(p['identical'] for p in rows)}/{sum(p['requests'] for p in rows)}"
            lines.append(f"| {concurrency} | {LOAD_PATH_LABELS[path]} | {tok_s:.1f} | {ratio} | {cpu} | {cpu_share} | {same} |")
    lines += ["", *[f"- {g}" for g in concurrency_goals(document)]]  # from the points: a result file never goes stale
    return "\n".join(lines) + "\n"


# ---- report ----------------------------------------------------------------------------------------------


def render_table(document: dict) -> str:
    """The README table (and the script's printout), from a result file alone."""
    meta = document["meta"]
    lines = [
        f"Workload: {meta['prompts']} prompts x up to {meta['max_tokens']} new tokens, greedy, all at once; each row the median of "
        f"{meta['repeats']} runs. " + provenance.measured_where(document),
        "",
        "| | method | weights | output tok/s | vs (b) | outputs identical to (a) |",
        "|---|---|---|---:|---:|---:|",
    ]
    for row in document["rows"]:
        same = "reference" if row["identical"] is None else f"{row['identical']}/{row['total']}"
        lines.append(f"| ({row['key']}) | {row['method']} | {row['precision']} | {row['tok_s']:.1f} | {row['vs_b']:.2f}× | {same} |")
    perplexity = document.get("perplexity") or {}
    if perplexity:
        base = perplexity.get("engine fp32")
        lines += ["", "| model | perplexity on the local text | vs fp32 engine |", "|---|---:|---:|"]
        for name, value in perplexity.items():
            rel = f"{(value / base - 1) * 100:+.2f}%" if base else "—"
            lines.append(f"| {name} | {value:.3f} | {rel} |")
    if document.get("goals"):
        lines += ["", *[f"- {g}" for g in document["goals"]]]
    return "\n".join(lines) + "\n"


def check_goals(rows: dict[tuple[str, str], Row], baseline: Row, perplexity: dict) -> list[str]:
    goals = []
    d32, c32, d8, c8 = (rows.get(k) for k in (("d", "fp32"), ("c", "fp32"), ("d", "int8"), ("c", "int8")))
    if d32:
        ok = d32.tok_s >= 3 * baseline.tok_s and d32.identical == d32.total
        goals.append(
            f"{'PASS' if ok else 'MISS'}: (d) fp32 >= 3x (b) with identical tokens "
            f"({d32.tok_s / baseline.tok_s:.2f}x, {d32.identical}/{d32.total})"
        )
    if d8 and "engine int8" in perplexity and "engine fp32" in perplexity:
        rel = perplexity["engine int8"] / perplexity["engine fp32"] - 1
        ok = d8.tok_s >= 5 * baseline.tok_s and rel <= 0.02
        goals.append(
            f"{'PASS' if ok else 'MISS'}: (d) int8 >= 5x (b) within 2% perplexity ({d8.tok_s / baseline.tok_s:.2f}x, {rel * 100:+.2f}%)"
        )
    for d, c in ((d32, c32), (d8, c8)):
        if d and c:
            ok = d.tok_s >= 0.95 * c.tok_s
            goals.append(f"{'PASS' if ok else 'MISS'}: (d) {d.precision} within 5% of (c) ({d.tok_s / c.tok_s * 100:.1f}%)")
    return goals


WEIGHT_ALGORITHMS = {"fp32": "none", "int8": "int8_wo", "int4": "int4_wo"}


def precision_config(base, precision: str):
    """The base config with the weights of `precision` (fp32, int8, int4) and free ports."""
    data = base.model_dump(mode="json")
    data["quantization"]["algorithm"] = WEIGHT_ALGORITHMS[precision]
    if precision == "int4":
        data["quantization"]["group_size"] = 64
    data["triton"].update({"http_port": 0, "grpc_port": 0, "metrics_port": 0})
    data["name"] = f"bench-cpu-{precision}"
    return type(base).model_validate({**data, "config_dir": str(base.config_dir)})


def own_session() -> None:
    """Leave the launching shell's session. With the kernel's autogroup scheduling every session shares one CPU
    slice on a busy host: tritonserver (deploy starts it in a session of its own) gets a slice of its own, so the
    in-process engine must not share ours with whatever else that shell runs."""
    if os.getsid(0) == os.getpid():
        return
    try:
        os.setsid()
    except PermissionError:  # a process-group leader (started from an interactive shell) cannot: a child can
        from trtllm_forge.processes import dying_with_parent

        argv = [sys.executable, *sys.argv]
        raise SystemExit(subprocess.call(argv, start_new_session=True, preexec_fn=dying_with_parent(new_group=False))) from None


def checkpoint_of(args):
    """(config, work root, checkpoint dir): --checkpoint, or the config's model.source imported under --root."""
    from trtllm_forge.config import load_config

    base = load_config(args.config)
    root = args.root.resolve()
    checkpoint = args.checkpoint
    if checkpoint is None:
        from trtllm_forge.importer.stage import import_checkpoint

        checkpoint = import_checkpoint(base, root / "import").checkpoint_dir
    return base, root, Path(checkpoint).resolve()


def publish(args, document: dict, text: str, default_out: Path) -> None:
    """Print the table, write the results file (--json or `default_out`) and, with --markdown, the table."""
    print(text)
    out = provenance.write_result(args.json_out or default_out, document)
    if args.markdown:
        args.markdown.write_text(text)
    info(f"wrote {out}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=REPO / "configs" / "smollm2-cpu.yaml")
    parser.add_argument("--root", type=Path, default=Path("forge-work") / "bench-cpu", help="Work directories go here.")
    parser.add_argument("--checkpoint", type=Path, help="HF checkpoint; default: import the config's model.source.")
    parser.add_argument("--precisions", default="fp32,int8")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--skip-triton", action="store_true", help="Only (a)-(c).")
    parser.add_argument("--skip-onnxruntime", action="store_true", help="Without (c-ort), the ONNX Runtime GenAI engine.")
    parser.add_argument("--repeats", type=int, default=3, help="Runs of (b), (c), (d) each; the median is reported.")
    parser.add_argument(
        "--concurrency",
        help="closed-loop mode instead of (a)-(d): served ensemble (streamed and not) and the tensorrt_llm model (streamed) "
        "against the same engine in-process at these concurrencies, e.g. 1,8,16, with the CPU seconds of every process; "
        "the first of --precisions; writes results/bench_cpu_engine/concurrency.json",
    )
    parser.add_argument(
        "--min-requests", type=int, default=16, help="closed-loop mode: requests per point, at least (and at least 2 x concurrency)"
    )
    parser.add_argument(
        "--json",
        dest="json_out",
        type=Path,
        help=f"Write the results here (default: {RESULTS} or, with --concurrency, {CONCURRENCY_RESULTS}).",
    )
    parser.add_argument("--note", help="stored with the results, e.g. what else ran on the machine")
    parser.add_argument("--markdown", type=Path, help="Also write the markdown table here.")
    args = parser.parse_args(argv)
    if args.concurrency:
        own_session()
        base, root, checkpoint = checkpoint_of(args)
        document = run_concurrency(args, base, root, checkpoint)
        publish(args, document, render_concurrency_table(document), CONCURRENCY_RESULTS)
        return 0
    document = provenance.record()  # commit, machine, bandwidth and load, before anything runs

    from trtllm_forge.builders.openvino.builder import build_engine

    base, root, checkpoint = checkpoint_of(args)
    info(f"loading transformers from {checkpoint}")
    tokenizer, model = load_transformers(checkpoint)
    prompt_ids = [tokenizer(p)["input_ids"] for p in PROMPTS]
    info("(a) transformers one at a time …")
    seq = run_transformers_sequential(model, prompt_ids, args.max_tokens)
    reference = seq.outputs
    info(f"    {seq.tok_s:.1f} tok/s")
    info("(b) transformers static batch …")
    batched = median_run(lambda: run_transformers_batched(model, prompt_ids, args.max_tokens, reference), args.repeats)
    info(f"    {batched.tok_s:.1f} tok/s")
    nll, count = transformers_nll(model, tokenizer)
    perplexity = {"transformers fp32": math.exp(nll / count)}
    model = None  # free it before the engines load

    rows = [seq, batched]
    table: dict[tuple[str, str], Row] = {}
    for precision in [p.strip() for p in args.precisions.split(",") if p.strip()]:
        config = precision_config(base, precision)
        workdir = root / precision
        info(f"building the {precision} engine in {workdir} …")
        engine_dir = build_engine(config, workdir, checkpoint).engine_dir
        assert engine_dir is not None  # an engine-target build
        nll, count = engine_nll(engine_dir, tokenizer)
        perplexity[f"engine {precision}"] = math.exp(nll / count)
        info(f"(c) engine in-process {precision} …")
        in_process = run_engine_in_process(config, engine_dir, prompt_ids, args.max_tokens, reference, precision, args.repeats)
        info(f"    {in_process.tok_s:.1f} tok/s, {in_process.identical}/16 identical")
        rows.append(in_process)
        table[("c", precision)] = in_process
        if not args.skip_onnxruntime:
            info(f"(c-ort) ONNX Runtime GenAI in-process {precision} …")
            ort = run_onnxruntime_in_process(
                config, root / f"ort-{precision}", checkpoint, prompt_ids, args.max_tokens, reference, precision, args.repeats
            )
            info(f"    {ort.tok_s:.1f} tok/s, {ort.identical}/16 identical")
            rows.append(ort)
            table[("c-ort", precision)] = ort
        if not args.skip_triton:
            info(f"(d) through Triton {precision} …")
            for row in run_triton(config, workdir, engine_dir, prompt_ids, args.max_tokens, reference, tokenizer, precision, args.repeats):
                info(f"    ({row.key}) {row.tok_s:.1f} tok/s, {row.identical}/16 identical")
                rows.append(row)
                table[(row.key, precision)] = row

    goals = check_goals(table, batched, perplexity)
    document["meta"] = {"max_tokens": args.max_tokens, "prompts": len(PROMPTS), "repeats": args.repeats, "checkpoint": str(checkpoint)}
    document["rows"] = [
        {**{k: v for k, v in asdict(r).items() if k != "outputs"}, "tok_s": r.tok_s, "vs_b": r.tok_s / batched.tok_s} for r in rows
    ]
    document["perplexity"] = perplexity
    document["goals"] = goals
    if args.note:
        document["note"] = args.note
    provenance.finish(document)
    publish(args, document, render_table(document), RESULTS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
