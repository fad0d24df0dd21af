"""What to change: the smallest change that makes a plan fit, build limits to use, and quantization choices."""

from __future__ import annotations

import math
from dataclasses import dataclass

from trtllm_forge.config import ForgeConfig
from trtllm_forge.config.checks import check_config
from trtllm_forge.plan.memory import GiB, blocks_per_sequence
from trtllm_forge.plan.planner import Plan, make_plan

GPU_QUANT_CHOICES = ("none", "fp8", "int4_awq")
CPU_QUANT_CHOICES = ("none", "int8_wo", "int4_awq")
# Quantizations tried for a plan that does not fit, least lossy first.
FIT_QUANT_ORDER = ("fp8", "int8_wo", "int4_awq", "nvfp4")
MAX_NUM_TOKENS_CEILING = 16384  # TensorRT-LLM warns above it (tensor volume)
MAX_TP = 64


def with_changes(config: ForgeConfig, **sections: dict) -> ForgeConfig:
    """A copy of the config with some fields of some sections replaced (no re-validation)."""
    update = {name: getattr(config, name).model_copy(update=fields) for name, fields in sections.items()}
    return config.model_copy(update=update)


def quantization_supported(config: ForgeConfig, algorithm: str) -> bool:
    """Whether the config's own cross-field rules accept this algorithm on its target."""
    trial = with_changes(config, quantization={"algorithm": algorithm})
    return not any(p.where.startswith("quantization.algorithm") for p in check_config(trial))


@dataclass(frozen=True)
class Change:
    field: str
    value: object
    why: str

    def __str__(self) -> str:
        return f"{self.field}: {self.value}"


def fitting_changes(plan: Plan) -> list[Change]:
    """Single changes, smallest first, each of which makes this plan fit."""
    config, out = plan.config, []
    cap = config.runtime.max_tokens_in_paged_kv_cache
    need_tokens = plan.blocks_per_sequence * plan.kv.tokens_per_block
    if plan.kv.limited_by == "max_tokens_in_paged_kv_cache" and cap is not None:
        trial = make_plan(
            with_changes(config, runtime={"max_tokens_in_paged_kv_cache": need_tokens}), plan.workload, plan.shape, plan.device
        )
        if trial.fits:
            out.append(Change("runtime.max_tokens_in_paged_kv_cache", need_tokens, "hold one full sequence"))
    if all(m.free > 0 for m in plan.memory):
        longest = plan.kv.blocks // plan.beam_width * plan.kv.tokens_per_block - (plan.max_seq_len - config.engine.max_seq_len)
        if longest >= 2:
            value = longest if longest > config.engine.max_input_len else f"{longest} with engine.max_input_len: {longest - 1}"
            out.append(Change("engine.max_seq_len", value, "the longest sequence the KV cache holds"))
    if config.quantization.kv_cache == "none":
        for kv in ("fp8", "int8"):
            changed = with_changes(config, quantization={"kv_cache": kv})
            if any(p.where.startswith("quantization.kv_cache") for p in check_config(changed)):
                continue
            if make_plan(changed, plan.workload, plan.shape, plan.device).fits:
                out.append(Change("quantization.kv_cache", kv, "half the KV bytes"))
                break
    for algorithm in FIT_QUANT_ORDER:
        if algorithm == config.quantization.algorithm or not quantization_supported(config, algorithm):
            continue
        if make_plan(with_changes(config, quantization={"algorithm": algorithm}), plan.workload, plan.shape, plan.device).fits:
            out.append(Change("quantization.algorithm", algorithm, "smaller weights"))
            break
    heads = plan.shape.num_attention_heads
    for tp in range(config.parallel.tp + 1, MAX_TP + 1):
        if heads % tp:
            continue
        changed = with_changes(config, parallel={"tp": tp, "moe_ep": None, "moe_tp": None})
        if make_plan(changed, plan.workload, plan.shape, plan.device).fits:
            out.append(Change("parallel.tp", tp, f"{tp} GPUs"))
            break
    return out


def refusal(plan: Plan) -> tuple[str, str, str]:
    """(where, problem, what would fit) for a plan that cannot hold one full sequence."""
    dev = plan.device.name
    short = [m for m in plan.memory if m.free <= 0]
    if short:
        m = short[0]
        problem = (
            f"the weights ({m.weights / GiB:.1f} GiB), activations ({m.activations / GiB:.1f} GiB) and runtime "
            f"({m.overhead / GiB:.1f} GiB) need more than the {m.device_bytes / GiB:.0f} GiB of one {dev}"
        )
    else:
        problem = (
            f"one {plan.max_seq_len}-token sequence needs {plan.blocks_per_sequence} KV blocks of "
            f"{plan.kv.tokens_per_block} tokens but {dev} holds {plan.kv.blocks} "
            f"(max {plan.kv.max_tokens} tokens, limited by {plan.kv.limited_by})"
        )
    changes = fitting_changes(plan)
    if not changes:
        return "hardware.gpu", problem, f"no single change of TP (up to {MAX_TP}), quantization or max_seq_len fits; use a larger GPU"
    first, rest = changes[0], changes[1:]
    valid = f"smallest change that fits: {first}" + (f" (or {', or '.join(str(c) for c in rest)})" if rest else "")
    return first.field, problem, valid


@dataclass(frozen=True)
class Recommendation:
    max_batch_size: int
    max_num_tokens: int
    tokens_per_block: int
    kv_cache_free_gpu_mem_fraction: float
    reasons: dict[str, str]


def recommend(plan: Plan) -> Recommendation:
    w, cfg = plan.workload, plan.config
    # The KV cache's capacity caps the batch; it is never a batch size to aim for (larger batches trade TTFT and TPOT
    # for tokens/s, which `trtllm-forge tune` measures against latency goals).
    capacity, configured = max(1, plan.max_concurrent_sequences), cfg.engine.max_batch_size
    if capacity < configured:
        batch = capacity
        why_batch = f"the KV cache holds only {capacity} sequences of {w.seq_len} tokens: more would wait for KV blocks"
    else:
        batch = configured
        why_batch = f"the config's; the KV cache has room for {capacity} sequences of {w.seq_len} tokens (capacity, not a target)"
    knee = plan.compute_bound_batch()
    if knee and 1 << math.ceil(math.log2(knee)) < batch:
        batch = 1 << math.ceil(math.log2(knee))
        why_batch = f"decode turns compute-bound at batch {knee}; larger batches add latency, not tokens/s"

    spec = cfg.engine.speculative
    per_step = spec.max_draft_len + 1 if spec.mode != "none" else 1
    if spec.mode == "eagle" and batch > 512:
        batch, why_batch = 512, "EAGLE allows at most 512"
    if batch * per_step > MAX_NUM_TOKENS_CEILING:
        batch = max(1, MAX_NUM_TOKENS_CEILING // per_step)
        why_batch = f"max_num_tokens must cover max_batch_size x (max_draft_len + 1) within {MAX_NUM_TOKENS_CEILING}"

    wanted_tokens = max(w.input_len + batch, batch * per_step)
    tokens = min(MAX_NUM_TOKENS_CEILING, max(2048, math.ceil(wanted_tokens / 1024) * 1024))
    why_tokens = "one full prompt plus one decode token per sequence in a step"
    if per_step > 1 and batch * per_step >= w.input_len + batch:
        why_tokens = f"max_batch_size x (max_draft_len + 1) = {batch * per_step} draft tokens per step"
    elif wanted_tokens > MAX_NUM_TOKENS_CEILING:
        why_tokens = f"capped at {MAX_NUM_TOKENS_CEILING} (TensorRT-LLM warns above); enable chunked context for longer prompts"

    waste = {tpb: blocks_per_sequence(w.seq_len, tpb) * tpb - w.seq_len for tpb in (32, 64)}
    tpb = 64 if waste[64] <= 0.01 * w.seq_len else 32
    why_tpb = f"wastes {waste[tpb]} tokens of the last block per {w.seq_len}-token sequence"

    fraction = cfg.runtime.kv_cache_free_gpu_mem_fraction
    m = min(plan.memory, key=lambda r: r.blocks_from_memory)
    free = max(m.free, 1.0)
    needed = (
        batch * blocks_per_sequence(w.seq_len, plan.kv.tokens_per_block, plan.beam_width) * plan.kv.tokens_per_block * m.kv_bytes_per_token
    )
    wanted = math.ceil(needed / free * 20) / 20  # next 0.05
    if wanted > fraction:
        fraction, why_fraction = min(0.95, wanted), f"{batch} sequences need {needed / GiB:.1f} GiB of KV per GPU"
    else:
        why_fraction = f"already holds {batch} sequences ({needed / GiB:.1f} GiB); the rest serves KV reuse"
    return Recommendation(
        batch,
        tokens,
        tpb,
        round(fraction, 2),
        {
            "max_batch_size": why_batch,
            "max_num_tokens": why_tokens,
            "tokens_per_block": why_tpb,
            "kv_cache_free_gpu_mem_fraction": why_fraction,
        },
    )


def quantization_comparison(plan: Plan) -> list[dict]:
    """The same model, device and parallelism under each common quantization."""
    choices = GPU_QUANT_CHOICES if plan.device.is_gpu else CPU_QUANT_CHOICES
    rows = []
    for algorithm in choices:
        trial = (
            plan
            if algorithm == plan.algorithm
            else make_plan(with_changes(plan.config, quantization={"algorithm": algorithm}), plan.workload, plan.shape, plan.device)
        )
        batch = max(1, min(plan.config.engine.max_batch_size, trial.max_concurrent_sequences))
        rows.append(
            {
                "algorithm": algorithm,
                "supported": algorithm == plan.algorithm or quantization_supported(plan.config, algorithm),
                "fits": trial.fits,
                "weights_bytes_per_gpu": round(trial.weights_bytes_per_gpu),
                "kv_max_tokens": trial.kv.max_tokens,
                "max_concurrent_sequences": trial.max_concurrent_sequences,
                "batch": batch,
                "decode_tokens_per_s": trial.decode_tokens_per_s(batch) if trial.fits else None,
            }
        )
    return rows
