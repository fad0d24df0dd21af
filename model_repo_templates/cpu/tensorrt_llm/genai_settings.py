"""OpenVINO GenAI settings from TensorRT-LLM's, defined once for both CPU engines: the CPU engine model
(model.py beside this file, inside the Triton python stub) and the LLM-API stand-in (trtllm_forge/llmapi_cpu/llm.py).

Standard library only: render copies this file next to model.py (render/templates.py, CPU_ENGINE_SIBLINGS), where
the stub imports it as a sibling; trtllm-forge imports it as trtllm_forge.model_repo_templates.cpu.tensorrt_llm.
`ov_genai` is the openvino_genai module or an engine adapter module (engine_adapter.py: the same SchedulerConfig).
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

# OpenVINO's CPU plugin stores the paged KV cache in blocks of 32 tokens.
CPU_KV_BLOCK_SIZE = 32
IDLE_WAIT_S = 0.05  # how long the engine thread waits for new requests when it has nothing to step
# The CPU engine model's wait for arrivals that should share a prefill step: after a step that ended requests
# (model.py _await_arrivals) and after an idle spell that followed a burst (_after_idle).
ARRIVAL_WINDOW_MS = 20
DEFAULT_MAX_NUM_TOKENS = 8192  # tokens per step when the engine config names none
PENALTIES = ("repetition_penalty", "presence_penalty", "frequency_penalty")  # the same names in TensorRT-LLM and GenAI
# Runtime properties under the engine's own (config.json `openvino.properties` wins). Thread pinning off: the
# engine shares its cores with Triton, the pre/post-processing stubs and whatever else runs on the host, and a
# pinned inference thread waits for its core instead of moving (batch-1 decode step 1.6x slower pinned on the
# shared 2-core machine, interleaved in one run); llama.cpp does not pin either. TBB's static partitioner: a batch-1
# step 1.09x faster in process with identical tokens (results/bench_batch1_roofline/batch1.json); served, batch-1 TPOT
# p50 17.0 against 18.3 ms, the same at concurrency 8 and with a third process keeping one core busy (interleaved:
# results/bench_cpu_engine/tbb_partitioner_served.json).
RUNTIME_PROPERTIES = {"ENABLE_CPU_PINNING": "NO", "TBB_PARTITIONER": "STATIC"}


def pipeline_properties(engine_properties: dict | None) -> dict[str, str]:
    """The OpenVINO properties a pipeline is compiled with: RUNTIME_PROPERTIES, then the engine config's own."""
    return {**RUNTIME_PROPERTIES, **{str(k): str(v) for k, v in (engine_properties or {}).items()}}


def kv_blocks_for(tokens: int) -> int:
    return max(1, math.ceil(tokens / CPU_KV_BLOCK_SIZE))


def scheduler_config(
    ov_genai: Any,
    *,
    kv_blocks: int,
    max_batch_size: int,
    max_num_tokens: int | None,
    max_input_len: int,
    prefix_caching: bool,
    split_fuse: bool,
) -> Any:
    """GenAI's SchedulerConfig for an engine of these limits (max_num_tokens None: DEFAULT_MAX_NUM_TOKENS)."""
    scheduler = ov_genai.SchedulerConfig()
    scheduler.num_kv_blocks = kv_blocks
    scheduler.max_num_seqs = max_batch_size
    scheduler.max_num_batched_tokens = int(max_num_tokens or DEFAULT_MAX_NUM_TOKENS)
    scheduler.enable_prefix_caching = prefix_caching
    scheduler.dynamic_split_fuse = split_fuse
    if not split_fuse:
        # Without split-fuse a whole prompt must fit in one step.
        scheduler.max_num_batched_tokens = max(scheduler.max_num_batched_tokens, max_input_len)
    return scheduler


def default_eos_ids(engine_dir: str | os.PathLike) -> list[int]:
    """The model's EOS ids from generation_config.json in the engine directory (one id or a list); [] when absent."""
    try:
        with open(os.path.join(engine_dir, "generation_config.json")) as handle:
            eos = json.load(handle).get("eos_token_id")
    except (OSError, ValueError):
        return []
    if eos is None:
        return []
    return [int(e) for e in eos] if isinstance(eos, list) else [int(eos)]


def set_sampling(config: Any, temperature: float, top_k: int, top_p: float, seed: int | None) -> None:
    """Random sampling on a GenerationConfig: top_k 0 keeps GenAI's default (no limit), top_p outside (0, 1] is 1."""
    config.do_sample = True
    config.temperature = temperature
    if top_k > 0:
        config.top_k = top_k
    config.top_p = top_p if 0.0 < top_p <= 1.0 else 1.0
    if seed is not None:
        config.rng_seed = int(seed)


def set_penalties(config: Any, values: dict[str, float | None]) -> None:
    """The PENALTIES given (not None) in `values` onto a GenerationConfig."""
    for name in PENALTIES:
        value = values.get(name)
        if value is not None:
            setattr(config, name, float(value))


def sampling_problem(config: Any) -> str | None:
    """GenAI's own check of a GenerationConfig: None when valid, else its first line."""
    try:
        config.validate()
    except Exception as exc:
        return f"sampling parameters: {exc}".splitlines()[0]
    return None
