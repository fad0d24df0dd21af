"""From a config, the model's shape and the target device to one `Plan`: memory per GPU, KV cache, roofline."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from trtllm_forge.builders.engines import engine_of
from trtllm_forge.config import ForgeConfig
from trtllm_forge.config.checks import shape_for
from trtllm_forge.dtypes import resolve_model_dtype
from trtllm_forge.errors import ConfigError
from trtllm_forge.hardware import Device, find_device
from trtllm_forge.model_shape import ModelShape
from trtllm_forge.plan.draft import DraftMemory, draft_shape, engine_draft, engine_draft_kv_settings, openvino_draft
from trtllm_forge.plan.memory import (
    CPU_RUNTIME_OVERHEAD_BYTES,
    DEVICE_MEMORY_UNIT,
    GPU_RUNTIME_OVERHEAD_BYTES,
    KVCache,
    RankMemory,
    activation_bytes,
    blocks_per_sequence,
    kv_bytes_per_token,
    kv_cache,
    rank_memory,
)
from trtllm_forge.plan.roofline import Machine, ModelCost, StepTime
from trtllm_forge.plan.weights import DTYPE_BYTES, Mapping, RankWeights, parameter_count, rank_weights

# Modes whose build adds max_draft_len to max_seq_len (the KV must hold the drafted tokens too).
DRAFTING_MODES = {"draft_target", "eagle", "medusa", "lookahead"}
CPU_PRECISION_BYTES = {"f32": 4, "bf16": 2, "auto": 2}


@dataclass(frozen=True)
class Workload:
    input_len: int
    output_len: int

    @property
    def seq_len(self) -> int:
        return self.input_len + self.output_len

    @property
    def mean_context(self) -> float:
        """KV tokens a sequence holds on average while it decodes."""
        return self.input_len + self.output_len / 2


@dataclass(frozen=True)
class BatchPoint:
    batch: int
    decode: StepTime
    prefill: StepTime
    kv_limited: bool  # more sequences than the KV cache holds at this workload

    @property
    def tokens_per_s(self) -> float:
        return self.batch / self.decode.seconds


@dataclass
class Plan:
    config: ForgeConfig
    shape: ModelShape
    device: Device
    mapping: Mapping
    algorithm: str
    dtype: str
    kv_dtype_bytes: int
    parameters: int
    weights: list[RankWeights]
    memory: list[RankMemory]
    kv: KVCache
    max_seq_len: int
    workload: Workload
    machine: Machine | None
    cost: ModelCost
    notes: list[str] = field(default_factory=list)
    draft: DraftMemory | None = None  # draft-target speculative decoding's draft model, when its shape is known

    @property
    def beam_width(self) -> int:
        return self.config.engine.max_beam_width

    @property
    def weights_bytes_per_gpu(self) -> float:
        return max(r.total for r in self.weights)

    @property
    def blocks_per_sequence(self) -> int:
        return blocks_per_sequence(self.max_seq_len, self.kv.tokens_per_block, self.beam_width)

    @property
    def fits(self) -> bool:
        draft_holds_one = self.draft is None or self.draft.kv_tokens >= self.config.engine.max_seq_len
        return all(r.free > 0 for r in self.memory) and self.kv.blocks >= self.blocks_per_sequence and draft_holds_one

    @property
    def max_concurrent_sequences(self) -> int:
        return self.kv.concurrent_sequences(self.workload.seq_len, self.beam_width)

    @property
    def max_concurrent_full_sequences(self) -> int:
        return self.kv.concurrent_sequences(self.max_seq_len, self.beam_width)

    def batches(self) -> list[int]:
        top = self.config.engine.max_batch_size
        sizes = {1 << i for i in range(top.bit_length()) if 1 << i <= top} | {top}
        return sorted(sizes)

    def point(self, batch: int) -> BatchPoint | None:
        if self.machine is None:
            return None
        return BatchPoint(
            batch=batch,
            decode=self.cost.decode(self.machine, batch, self.workload.mean_context),
            prefill=self.cost.prefill(self.machine, batch, self.workload.input_len),
            kv_limited=batch > self.max_concurrent_sequences,
        )

    def decode_tokens_per_s(self, batch: int) -> float | None:
        """The roofline's best-case output tokens/s at this batch (None without device numbers)."""
        p = self.point(batch)
        return p.tokens_per_s if p else None

    def percent_of_roofline(self, measured_tokens_per_s: float, batch: int) -> float | None:
        """A measured output tokens/s as a percentage of the physical limit at the same batch size."""
        limit = self.decode_tokens_per_s(batch)
        return 100.0 * measured_tokens_per_s / limit if limit else None

    def compute_bound_batch(self) -> int | None:
        return self.cost.compute_bound_batch(self.machine, self.workload.mean_context) if self.machine else None


def kv_dtype_bytes(config: ForgeConfig, dtype: str) -> int:
    if config.quantization.kv_cache in ("fp8", "int8"):
        return 1
    if config.engine.backend == "openvino":
        return CPU_PRECISION_BYTES[config.engine.cpu_inference_precision]
    return DTYPE_BYTES[dtype]


def default_workload(config: ForgeConfig) -> Workload:
    if config.bench.workloads:
        from trtllm_forge.bench.options import mean_lengths

        return Workload(*mean_lengths(config.bench.workloads[0]))  # "LO..HI" and "MEAN:STD" are lengths too
    eng = config.engine
    return Workload(eng.max_input_len, max(1, eng.max_seq_len - eng.max_input_len))


def effective_max_seq_len(config: ForgeConfig) -> int:
    spec = config.engine.speculative
    engine_build = config.engine.backend == "tensorrt-llm" and config.engine.target == "engine"
    extra = spec.max_draft_len if engine_build and spec.mode in DRAFTING_MODES else 0
    return config.engine.max_seq_len + extra


def resolve_inputs(config: ForgeConfig) -> tuple[ModelShape, Device]:
    shape = shape_for(config)
    if shape is None:
        raise ConfigError(
            "model.name",
            f"the shape of {config.model.source!r} is unknown (no local config.json, no catalog entry)",
            "point model.source at a Hugging Face directory or set model.name to a catalog model",
        )
    device = find_device(config.hardware.gpu)
    if device is None:
        raise ConfigError("hardware.gpu", f"unknown device {config.hardware.gpu!r}", "see data/hardware.json")
    return shape, device


def make_plan(config: ForgeConfig, workload: Workload | None = None, shape: ModelShape | None = None, device: Device | None = None) -> Plan:
    if shape is None or device is None:
        found_shape, found_device = resolve_inputs(config)
        shape, device = shape or found_shape, device or found_device
    eng, par, quant = config.engine, config.parallel, config.quantization
    workload = workload or default_workload(config)
    algorithm = quant.algorithm
    dtype = resolve_model_dtype(config)
    dbytes = DTYPE_BYTES[dtype]
    kv_bytes = kv_dtype_bytes(config, dtype)
    mapping = Mapping.create(par.tp, par.pp, par.moe_ep, par.moe_tp)
    separate_lm_head = eng.backend == "tensorrt-llm" or not shape.tie_word_embeddings
    weights = rank_weights(shape, mapping, algorithm, dbytes, quant.group_size, separate_lm_head)

    act_dtype_bytes = dbytes if device.is_gpu else CPU_PRECISION_BYTES[eng.cpu_inference_precision]
    act_tokens = eng.resolved_max_num_tokens if eng.plugins.remove_input_padding else eng.max_batch_size * eng.max_input_len
    activations = activation_bytes(shape, mapping, act_tokens, eng.max_batch_size, act_dtype_bytes)
    overhead = GPU_RUNTIME_OVERHEAD_BYTES if device.is_gpu else CPU_RUNTIME_OVERHEAD_BYTES
    per_token = [kv_bytes_per_token(shape, mapping, r.layers, kv_bytes) for r in weights]
    device_bytes = device.memory_gb * DEVICE_MEMORY_UNIT
    fraction, cap = config.runtime.kv_cache_free_gpu_mem_fraction, config.runtime.max_tokens_in_paged_kv_cache
    draft = plan_draft(config, mapping, dbytes, kv_bytes, act_dtype_bytes, act_tokens, device_bytes, overhead)
    memory = [
        rank_memory(
            r.stage,
            device_bytes,
            r.total,
            activations,
            overhead,
            bpt,
            fraction,
            eng.tokens_per_block,
            draft=draft.held(r.stage) if draft else 0.0,
            draft_kv_per_token=draft.kv_bytes_per_token[r.stage] if draft and not draft.own_pool else 0,
        )
        for r, bpt in zip(weights, per_token, strict=False)
    ]
    kv = kv_cache(memory, eng.tokens_per_block, cap)
    if draft is not None and not draft.own_pool:
        draft = replace(draft, kv_tokens=kv.max_tokens)
    machine = Machine.for_device(device, algorithm, dtype)
    cost = ModelCost(shape, mapping, weights, per_token, act_dtype_bytes, dbytes, par.gpus_per_node if device.is_gpu else 0)

    notes = []
    max_seq = effective_max_seq_len(config)
    if max_seq != eng.max_seq_len:
        notes.append(f"the build adds max_draft_len to max_seq_len: each sequence needs KV for {max_seq} tokens")
    notes += draft_notes(config, draft)
    if machine is None:
        notes.append(f"no bandwidth/throughput for {device.name}: run `trtllm-forge plan --measure-host` for a roofline")
    if not device.is_gpu and device.measured_at is None:
        notes.append("cpu memory is the table's placeholder; `plan --measure-host` measures this host")
    engine_note = engine_of(eng.backend).plan_note
    if engine_note:
        notes.append(
            engine_note.format(
                kv_bytes=kv_bytes, cpu_inference_precision=eng.cpu_inference_precision, kv_tokens=eng.max_batch_size * max_seq
            )
        )
    return Plan(
        config,
        shape,
        device,
        mapping,
        algorithm,
        dtype,
        kv_bytes,
        parameter_count(shape),
        weights,
        memory,
        kv,
        max_seq,
        workload,
        machine,
        cost,
        notes,
        draft,
    )


def plan_draft(
    config: ForgeConfig,
    mapping: Mapping,
    dtype_bytes: int,
    kv_bytes: int,
    act_bytes: int,
    act_tokens: int,
    device_bytes: float,
    overhead: float,
) -> DraftMemory | None:
    """The draft model's memory (plan/draft.py), its own KV pool already sized on the engine path."""
    eng = config.engine
    shape = draft_shape(config)
    if shape is None or (eng.backend == "tensorrt-llm" and eng.target != "engine"):
        return None
    if eng.backend == "openvino":
        return openvino_draft(config, shape, kv_bytes, act_bytes, act_tokens)
    if eng.backend != "tensorrt-llm":
        return None
    draft = engine_draft(config, shape, mapping, dtype_bytes, act_tokens)
    fraction, cap = engine_draft_kv_settings(config)
    own = [
        rank_memory(stage, device_bytes, weights, draft.activations, overhead, bpt, fraction, eng.tokens_per_block)
        for stage, (weights, bpt) in enumerate(zip(draft.weights, draft.kv_bytes_per_token, strict=False))
    ]
    pool = kv_cache(own, eng.tokens_per_block, cap)
    return replace(draft, kv_tokens=pool.max_tokens)


def draft_notes(config: ForgeConfig, draft: DraftMemory | None) -> list[str]:
    spec, eng = config.engine.speculative, config.engine
    if spec.mode != "draft_target":
        return []
    if draft is None:
        if eng.backend == "tensorrt-llm" and eng.target != "engine":
            return ["the LLM API's draft model (speculative_model) is not included: only the engine and OpenVINO paths model it"]
        return [f"the draft model's memory is not included: no readable config.json in engine.speculative.draft_model ({spec.draft_model})"]
    if draft.own_pool:
        uncapped = config.runtime.max_tokens_in_paged_kv_cache is None
        return [
            f"the draft engine runs as a second executor on the same GPUs and is created first: its KV pool takes "
            f"kv_cache_free_gpu_mem_fraction ({config.runtime.kv_cache_free_gpu_mem_fraction}) of the memory free after its "
            "weights, the target's pool gets that fraction of what is left"
            + ("; set runtime.max_tokens_in_paged_kv_cache (or a fraction near 0.5, as NVIDIA's example) to share it" if uncapped else "")
        ]
    return ["the draft's KV pool has as many blocks as the target's (GenAI copies the target's scheduler config)"]
