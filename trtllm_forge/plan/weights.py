"""Weight memory per GPU: parameter counts from the model's shape, bytes by quantization, split by TP/PP/EP.

What stays unquantized follows TensorRT-LLM's quantized checkpoints: the embedding table, `lm_head`, the norms,
attention biases and the MoE router keep the model dtype; attention and MLP/expert projections are quantized.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from trtllm_forge.model_shape import ModelShape

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}

# Bytes per weight element of the quantized projections.
WEIGHT_BYTES = {"fp8": 1.0, "int8_sq": 1.0, "int8_wo": 1.0, "int4_awq": 0.5, "w4a8_awq": 0.5, "int4_wo": 0.5, "nvfp4": 0.5}
NVFP4_BLOCK = 16  # NVFP4 stores one FP8 scale per 16 weights


def linear_bytes(in_features: int, out_features: int, algorithm: str, dtype_bytes: int, group_size: int) -> float:
    """Bytes of one projection weight (in x out) including its quantization scales."""
    elements = in_features * out_features
    if algorithm == "none":
        return elements * dtype_bytes
    data = elements * WEIGHT_BYTES[algorithm]
    if algorithm in ("int4_awq", "w4a8_awq"):
        # one fp16 scale per group of `group_size` inputs per output, plus AWQ's fp16 pre-quant scale per input
        return data + math.ceil(in_features / group_size) * out_features * 2 + in_features * 2
    if algorithm in ("int8_wo", "int4_wo"):
        return data + out_features * 2  # per-channel fp16 scale
    if algorithm == "int8_sq":
        return data + out_features * 4  # per-channel fp32 scale
    if algorithm == "nvfp4":
        return data + math.ceil(in_features / NVFP4_BLOCK) * out_features
    return data  # fp8: per-tensor scalars only


def has_qkv_bias(shape: ModelShape) -> bool:
    return shape.model_type == "qwen2"


def parameter_count(shape: ModelShape) -> int:
    """Parameters of the whole checkpoint (tied embeddings counted once), as Hugging Face reports them."""
    h, hd, L = shape.hidden_size, shape.head_dim, shape.num_hidden_layers
    q, kv = shape.num_attention_heads * hd, shape.num_key_value_heads * hd
    attention = h * q + 2 * h * kv + q * h + ((q + 2 * kv) if has_qkv_bias(shape) else 0)
    if shape.is_moe:
        mlp = shape.num_local_experts * 3 * h * shape.intermediate_size + h * shape.num_local_experts
    else:
        mlp = 3 * h * shape.intermediate_size
    per_layer = attention + mlp + 2 * h
    embeddings = shape.vocab_size * h * (1 if shape.tie_word_embeddings else 2)
    return L * per_layer + embeddings + h


@dataclass(frozen=True)
class Mapping:
    """How the model is split: tp ranks per stage, pp stages, and the MoE split of tp into ep x moe_tp."""

    tp: int = 1
    pp: int = 1
    moe_ep: int = 1
    moe_tp: int = 1

    @classmethod
    def create(cls, tp: int, pp: int, moe_ep: int | None, moe_tp: int | None) -> Mapping:
        ep = moe_ep or 1
        return cls(tp=tp, pp=pp, moe_ep=ep, moe_tp=moe_tp or max(1, tp // ep))

    def stage_layers(self, num_layers: int) -> list[int]:
        base, extra = divmod(num_layers, self.pp)
        return [base + (1 if stage < extra else 0) for stage in range(self.pp)]

    def local_kv_heads(self, kv_heads: int) -> int:
        # With more TP ranks than KV heads each rank keeps a replicated copy of one head.
        return max(1, math.ceil(kv_heads / self.tp))


@dataclass(frozen=True)
class RankWeights:
    """Weight bytes held by one GPU (every TP rank of a stage holds the same amount)."""

    stage: int
    layers: int
    projections: float  # attention + dense MLP projections (quantized)
    experts: float  # MoE experts on this rank (quantized)
    expert_bytes_each: float  # one local expert slice
    local_experts: int
    embedding: float
    lm_head: float
    other: float  # norms, biases, router (model dtype)
    head_is_embedding: bool = False  # a tied table serves as lm_head on this rank

    @property
    def total(self) -> float:
        return self.projections + self.experts + self.embedding + self.lm_head + self.other


def rank_weights(
    shape: ModelShape,
    mapping: Mapping,
    algorithm: str,
    dtype_bytes: int,
    group_size: int,
    separate_lm_head: bool,
) -> list[RankWeights]:
    """Weights per GPU for each pipeline stage.

    The embedding table is replicated on every TP rank of the first stage (TensorRT-LLM's default without
    parallel embedding); `lm_head` is split over TP on the last stage. `separate_lm_head` is False when a tied
    table is shared (OpenVINO keeps one copy); TensorRT-LLM stores `lm_head` separately even when tied.
    """
    h, hd, tp = shape.hidden_size, shape.head_dim, mapping.tp
    q_local = shape.num_attention_heads * hd // tp
    kv_local = mapping.local_kv_heads(shape.num_key_value_heads) * hd
    g = group_size

    def lin(i: int, o: int) -> float:
        return linear_bytes(i, o, algorithm, dtype_bytes, g)

    attention = lin(h, q_local) + 2 * lin(h, kv_local) + lin(q_local, h)
    bias = (q_local + 2 * kv_local) * dtype_bytes if has_qkv_bias(shape) else 0
    if shape.is_moe:
        inter = shape.intermediate_size // mapping.moe_tp
        expert = 2 * lin(h, inter) + lin(inter, h)
        local_experts = shape.num_local_experts // mapping.moe_ep
        dense_mlp, router = 0.0, h * shape.num_local_experts * dtype_bytes
    else:
        inter = shape.intermediate_size // tp
        expert, local_experts = 0.0, 0
        dense_mlp, router = 2 * lin(h, inter) + lin(inter, h), 0
    per_layer_other = 2 * h * dtype_bytes + bias + router

    out = []
    layers = mapping.stage_layers(shape.num_hidden_layers)
    for stage, n in enumerate(layers):
        first, last = stage == 0, stage == len(layers) - 1
        out.append(
            RankWeights(
                stage=stage,
                layers=n,
                projections=n * (attention + dense_mlp),
                experts=n * local_experts * expert,
                expert_bytes_each=expert,
                local_experts=local_experts,
                embedding=shape.vocab_size * h * dtype_bytes if first else 0.0,
                lm_head=math.ceil(shape.vocab_size / tp) * h * dtype_bytes if (last and separate_lm_head) else 0.0,
                other=n * per_layer_other + (h * dtype_bytes if last else 0),
                head_is_embedding=last and first and not separate_lm_head,
            )
        )
    return out
