"""The draft model of draft-target speculative decoding: its weights, activations and KV cache beside the target's.

Engine path (TensorRT-LLM 1.2, NVIDIA's draft-target model: examples/draft_target_model/README.md and
examples/run.py / examples/ngram/run_dtm_ngram.py of NVIDIA/TensorRT-LLM): the draft checkpoint is converted
unquantized at the model dtype with the target's TP/PP (builders/tensorrt_llm/plan.py) and built as its own engine
with the same max_batch_size, max_input_len, max_seq_len and max_num_tokens; it runs as a second executor
(Triton's `tensorrt_llm_draft` model) on the same GPUs with the same `kv_cache_free_gpu_mem_fraction` and
`max_tokens_in_paged_kv_cache` (NVIDIA fills both config.pbtxt files alike). Its executor is created first, so its
KV pool takes that fraction of the memory free after its own weights; the target sizes its pool from what is left.

OpenVINO path (OpenVINO GenAI's speculative ContinuousBatchingPipeline, src/cpp/src/speculative_decoding/
speculative_decoding_impl.cpp of openvinotoolkit/openvino.genai): the build exports the draft with int8 weights
(builders/openvino/plan.py); a draft given without its own scheduler config gets a copy of the target's, and the
CPU engine model sizes the pool in blocks (num_kv_blocks, cache_size 0), so the draft's pool has as many blocks as
the target's, in the precision the same hints give. Every matmul weight of an int8 export, the embedding table
included, is one byte with a per-output-channel fp16 scale and u8 zero point (NNCF's asymmetric int8).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from trtllm_forge.config import ForgeConfig
from trtllm_forge.model_shape import ModelShape, shape_from_checkpoint_dir
from trtllm_forge.plan.memory import activation_bytes, kv_bytes_per_token
from trtllm_forge.plan.weights import Mapping, RankWeights, parameter_count, rank_weights

OPENVINO_IR_WEIGHTS = "openvino_model.bin"
# NNCF's asymmetric int8 weight compression: per output channel one fp16 scale and one u8 zero point.
OPENVINO_INT8_CHANNEL_BYTES = 2 + 1


@dataclass(frozen=True)
class DraftMemory:
    """What the draft model holds on each GPU (or on the host), stage by stage like the target."""

    shape: ModelShape
    precision: str  # how its weights are stored
    weights: list[float]  # bytes per GPU of each pipeline stage
    activations: float
    kv_bytes_per_token: list[int]  # per GPU of each stage
    kv_dtype_bytes: int
    own_pool: bool  # engine path: a pool of its own, sized before the target's; OpenVINO: mirrors the target's blocks
    kv_tokens: int = 0  # own pool: tokens it holds (set once sized); mirrored: the target's

    def kv_bytes(self, stage: int) -> float:
        return self.kv_tokens * self.kv_bytes_per_token[stage]

    def held(self, stage: int) -> float:
        """Bytes the draft takes on one GPU of `stage` before the target sizes its KV pool."""
        fixed = self.weights[stage] + self.activations
        return fixed + self.kv_bytes(stage) if self.own_pool else fixed


def engine_draft_kv_settings(config: ForgeConfig) -> tuple[float, int | None]:
    """kv_cache_free_gpu_mem_fraction and max_tokens_in_paged_kv_cache of the draft engine model: the target's own.

    NVIDIA fills both config.pbtxt files with the same values (kv_cache_free_gpu_mem_fraction:0.5,
    max_tokens_in_paged_kv_cache:2560 for tensorrt_llm and tensorrt_llm_draft in examples/draft_target_model/README.md
    of NVIDIA/TensorRT-LLM, commit 567239fcd40bda119965a3a8abf43856c63c9527). `plan` sizes the draft's pool with these
    and render writes them into tensorrt_llm_draft/config.pbtxt, so both read them here.
    """
    return config.runtime.kv_cache_free_gpu_mem_fraction, config.runtime.max_tokens_in_paged_kv_cache


def draft_shape(config: ForgeConfig) -> ModelShape | None:
    spec = config.engine.speculative
    if str(getattr(spec.mode, "value", spec.mode)) != "draft_target" or not spec.draft_model:
        return None
    return shape_from_checkpoint_dir(config.resolve_path(spec.draft_model))


def openvino_int8_bytes(shape: ModelShape) -> float:
    """An int8 OpenVINO export: every weight one byte plus per-channel scale and zero point; norms stay f32."""
    h, hd, L = shape.hidden_size, shape.head_dim, shape.num_hidden_layers
    q, kv = shape.num_attention_heads * hd, shape.num_key_value_heads * hd
    channels = L * (q + 2 * kv + h + 2 * shape.intermediate_size + h)  # outputs of q, k, v, o, gate, up, down
    tables = 1 if shape.tie_word_embeddings else 2
    channels += tables * shape.vocab_size
    unquantized = (parameter_count(shape) - _matmul_parameters(shape)) * 4
    return _matmul_parameters(shape) + channels * OPENVINO_INT8_CHANNEL_BYTES + unquantized


def _matmul_parameters(shape: ModelShape) -> int:
    h, hd, L = shape.hidden_size, shape.head_dim, shape.num_hidden_layers
    q, kv = shape.num_attention_heads * hd, shape.num_key_value_heads * hd
    per_layer = h * q + 2 * h * kv + q * h + 3 * h * shape.intermediate_size
    return L * per_layer + shape.vocab_size * h * (1 if shape.tie_word_embeddings else 2)


def engine_draft(config: ForgeConfig, shape: ModelShape, mapping: Mapping, dtype_bytes: int, act_tokens: int) -> DraftMemory:
    """The draft engine: unquantized at the model dtype, its KV unquantized, the target's parallel mapping."""
    weights = rank_weights(shape, mapping, "none", dtype_bytes, config.quantization.group_size, separate_lm_head=True)
    return DraftMemory(
        shape=shape,
        precision=f"{dtype_bytes * 8}-bit (unquantized, the model dtype)",
        weights=[w.total for w in weights],
        activations=activation_bytes(shape, mapping, act_tokens, config.engine.max_batch_size, dtype_bytes),
        kv_bytes_per_token=_per_token(shape, mapping, weights, dtype_bytes),
        kv_dtype_bytes=dtype_bytes,
        own_pool=True,
    )


def openvino_draft(config: ForgeConfig, shape: ModelShape, kv_bytes: int, act_bytes: int, act_tokens: int) -> DraftMemory:
    """The draft beside an OpenVINO engine: int8 export (or the IR as given), the target's KV precision and blocks."""
    mapping = Mapping()
    source = config.resolve_path(config.engine.speculative.draft_model)  # type: ignore[arg-type]
    ir = Path(source) / OPENVINO_IR_WEIGHTS
    if ir.is_file():
        weights, precision = float(ir.stat().st_size), f"as exported ({OPENVINO_IR_WEIGHTS} size)"
    else:
        from trtllm_forge.builders.openvino.plan import DRAFT_WEIGHT_FORMAT

        weights, precision = openvino_int8_bytes(shape), f"{DRAFT_WEIGHT_FORMAT} (OpenVINO export)"
    layers = rank_weights(shape, mapping, "none", 4, config.quantization.group_size, separate_lm_head=False)
    return DraftMemory(
        shape=shape,
        precision=precision,
        weights=[weights],
        activations=activation_bytes(shape, mapping, act_tokens, config.engine.max_batch_size, act_bytes),
        kv_bytes_per_token=_per_token(shape, mapping, layers, kv_bytes),
        kv_dtype_bytes=kv_bytes,
        own_pool=False,
    )


def _per_token(shape: ModelShape, mapping: Mapping, weights: list[RankWeights], kv_bytes: int) -> list[int]:
    return [kv_bytes_per_token(shape, mapping, w.layers, kv_bytes) for w in weights]
