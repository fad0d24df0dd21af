"""Memory per GPU besides the weights, and the paged KV cache that fills what is left.

KV cache (TensorRT-LLM's KV cache manager, in our words): bytes per token = layers on this rank x KV heads on this
rank x head_dim x 2 (K and V) x KV dtype bytes; the token budget is (free memory x kv_cache_free_gpu_mem_fraction)
/ bytes per token, capped by max_tokens_in_paged_kv_cache, counted in whole blocks of tokens_per_block, and the
minimum over all ranks is what every rank uses.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from trtllm_forge.model_shape import ModelShape
from trtllm_forge.plan.weights import Mapping

GiB = 1024**3
# GPU memory comes in binary sizes: an "80 GB" part has 80 GiB, of which CUDA reports about 99% as total.
DEVICE_MEMORY_UNIT = GiB

# A round allowance, not a measurement: the CUDA context, cuBLAS/NCCL workspaces and the runtime's I/O and
# decoder buffers (TensorRT-LLM logs the last as "Allocated ... for runtime buffers/decoder"); all of them are
# taken before the KV cache is sized from what is free.
GPU_RUNTIME_OVERHEAD_BYTES = 1 * GiB
# The Python/Triton processes next to an OpenVINO engine on the host.
CPU_RUNTIME_OVERHEAD_BYTES = 1 * GiB

LOGITS_BYTES = 4  # the last-token logits are float32


def activation_bytes(shape: ModelShape, mapping: Mapping, tokens: int, max_batch_size: int, act_bytes: int) -> float:
    """Peak activation memory of one step, bounded by the tokens in flight (`max_num_tokens` with packed input).

    TensorRT reuses activation memory across layers, so the peak is one layer's live tensors per token: the
    residual and normed hidden states, the local q/k/v, and the local MLP gate, up and product (top-k of them
    for MoE), plus float32 logits for the last token of every sequence. TP shrinks it; PP does not.
    """
    h, hd = shape.hidden_size, shape.head_dim
    qkv = (shape.num_attention_heads // mapping.tp + 2 * mapping.local_kv_heads(shape.num_key_value_heads)) * hd
    if shape.is_moe:
        mlp = shape.intermediate_size // mapping.moe_tp * max(1, shape.num_experts_per_tok)
    else:
        mlp = shape.intermediate_size // mapping.tp
    per_token = 2 * h + qkv + 3 * mlp
    logits = max_batch_size * math.ceil(shape.vocab_size / mapping.tp) * LOGITS_BYTES
    return tokens * per_token * act_bytes + logits


def kv_bytes_per_token(shape: ModelShape, mapping: Mapping, layers_on_rank: int, kv_dtype_bytes: int) -> int:
    return layers_on_rank * mapping.local_kv_heads(shape.num_key_value_heads) * shape.head_dim * 2 * kv_dtype_bytes


def blocks_per_sequence(seq_len: int, tokens_per_block: int, beam_width: int = 1) -> int:
    return beam_width * math.ceil(seq_len / tokens_per_block)


@dataclass(frozen=True)
class RankMemory:
    stage: int
    device_bytes: float
    weights: float
    activations: float
    overhead: float
    kv_bytes_per_token: int
    kv_budget_bytes: float  # free x fraction
    blocks_from_memory: int
    draft: float = 0.0  # what a draft model holds here before this pool is sized (plan/draft.py)
    draft_kv_bytes_per_token: int = 0  # a draft pool that mirrors this one block for block (OpenVINO)

    @property
    def free(self) -> float:
        return self.device_bytes - self.weights - self.activations - self.overhead - self.draft


@dataclass(frozen=True)
class KVCache:
    tokens_per_block: int
    blocks: int  # the minimum over ranks, cap applied
    limited_by: str  # "memory" or "max_tokens_in_paged_kv_cache"
    bytes_per_token: int  # the largest per-rank value (the rank that limits)

    @property
    def max_tokens(self) -> int:
        return self.blocks * self.tokens_per_block

    def concurrent_sequences(self, seq_len: int, beam_width: int = 1) -> int:
        return self.blocks // blocks_per_sequence(seq_len, self.tokens_per_block, beam_width)


def rank_memory(
    stage: int,
    device_bytes: float,
    weights: float,
    activations: float,
    overhead: float,
    kv_per_token: int,
    fraction: float,
    tokens_per_block: int,
    draft: float = 0.0,
    draft_kv_per_token: int = 0,
) -> RankMemory:
    free = device_bytes - weights - activations - overhead - draft
    budget = max(0.0, free) * fraction
    per_token = kv_per_token + draft_kv_per_token
    # whole tokens first, then blocks rounded up, as TensorRT-LLM sizes its primary pool
    blocks = math.ceil(int(budget // per_token) / tokens_per_block) if per_token else 0
    return RankMemory(stage, device_bytes, weights, activations, overhead, kv_per_token, budget, blocks, draft, draft_kv_per_token)


def kv_cache(ranks: list[RankMemory], tokens_per_block: int, max_tokens_cap: int | None) -> KVCache:
    limiting = min(ranks, key=lambda r: r.blocks_from_memory)
    blocks, limited_by = limiting.blocks_from_memory, "memory"
    if max_tokens_cap is not None:
        cap_blocks = math.ceil(max_tokens_cap / tokens_per_block)
        if cap_blocks < blocks:
            blocks, limited_by = cap_blocks, "max_tokens_in_paged_kv_cache"
    return KVCache(tokens_per_block, blocks, limited_by, max(r.kv_bytes_per_token for r in ranks))
