"""Cross-field rules: combinations that each field alone allows but the build or the server would reject.

Each rule is a small function registered in RULES; it yields ConfigError for every problem it finds.
Rules that need the model's shape or the GPU's capability are skipped when those are unknown.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from trtllm_forge.config.schema import ForgeConfig
from trtllm_forge.deploy.kinds import KINDS
from trtllm_forge.deploy.kinds.protocol import ConfigRule
from trtllm_forge.errors import ConfigError
from trtllm_forge.hardware import Device, find_device, hardware_table
from trtllm_forge.model_shape import BUILTIN_SOURCES, ModelShape, resolve_shape


@dataclass(frozen=True)
class CheckContext:
    config: ForgeConfig
    shape: ModelShape | None
    device: Device | None

    @property
    def is_trtllm(self) -> bool:
        return self.config.engine.backend == "tensorrt-llm"

    @property
    def compute_capability(self) -> float | None:
        return self.device.compute_capability if self.device else None

    @property
    def device_name(self) -> str:
        return self.device.name if self.device else "no device"


Rule = Callable[[CheckContext], Iterator[ConfigError]]
RULES: dict[str, Rule] = {}


def rule(func: Rule) -> Rule:
    RULES[func.__name__] = func
    return func


OPENVINO_ALGOS = {"none", "int8_wo", "int4_wo", "int4_awq"}
ONNXRUNTIME_ALGOS = {"none", "int8_wo", "int4_wo"}  # builders/onnxruntime/plan.py maps each to the builder's precision
INT4_ALGOS = {"int4_wo", "int4_awq", "w4a8_awq"}


@dataclass(frozen=True)
class CpuBackendLimits:
    """What a CPU engine backend serves: the quantization, KV cache and speculative modes it takes."""

    algorithms: frozenset[str]
    kv_caches: tuple[str, ...]
    speculative_modes: tuple[str, ...]


CPU_BACKEND_LIMITS = {
    "openvino": CpuBackendLimits(frozenset(OPENVINO_ALGOS), ("int8", "none"), ("none", "draft_target", "prompt_lookup")),
    # ONNX Runtime GenAI: fp32/int8/int4 weights, an fp32 KV cache of max_seq_len per sequence, no speculative decoding.
    "onnxruntime": CpuBackendLimits(frozenset(ONNXRUNTIME_ALGOS), ("none",), ("none",)),
}


def _one_of(allowed: tuple[str, ...]) -> str:
    return f"set {allowed[0]}" if len(allowed) == 1 else f"one of {', '.join(allowed)}"


@rule
def input_within_sequence(ctx: CheckContext) -> Iterator[ConfigError]:
    eng = ctx.config.engine
    if eng.max_input_len > eng.max_seq_len:
        yield ConfigError(
            "engine.max_input_len",
            f"{eng.max_input_len} is larger than engine.max_seq_len ({eng.max_seq_len})",
            "max_input_len must be <= max_seq_len",
        )


@rule
def known_hardware(ctx: CheckContext) -> Iterator[ConfigError]:
    if ctx.device is None:
        names = ", ".join(hardware_table())
        yield ConfigError("hardware.gpu", f"unknown device {ctx.config.hardware.gpu!r}", f"one of {names}")


@rule
def backend_matches_hardware(ctx: CheckContext) -> Iterator[ConfigError]:
    if ctx.device is None:
        return
    if ctx.is_trtllm and not ctx.device.is_gpu:
        yield ConfigError(
            "engine.backend",
            "tensorrt-llm needs an NVIDIA GPU but hardware.gpu is 'cpu'",
            "set hardware.gpu to the target GPU (e.g. H100-SXM) or use engine.backend: openvino",
        )
    if not ctx.is_trtllm and ctx.device.is_gpu:
        yield ConfigError(
            "engine.backend",
            f"{ctx.config.engine.backend} runs on the CPU but hardware.gpu is {ctx.device_name!r}",
            "set hardware.gpu: cpu, or engine.backend: tensorrt-llm",
        )


def _server_kind_rule(server: str, check: ConfigRule) -> Rule:
    """A rule of a server kind (deploy/kinds/), applied to the configs whose deploy.server is that kind."""

    def applied(ctx: CheckContext) -> Iterator[ConfigError]:
        if ctx.config.deploy.server == server:
            yield from check(ctx.config)

    applied.__name__ = check.__name__
    return applied


for _kind in KINDS.values():
    for _check in _kind.config_rules:
        rule(_server_kind_rule(_kind.name, _check))


@rule
def llm_api_options_known(ctx: CheckContext) -> Iterator[ConfigError]:
    """Keys the LLM API would refuse at LLM() time, found before any GPU time (llmapi_args holds the 1.2 table)."""
    from trtllm_forge.llmapi_args import describe, unknown_keys

    for key, near in unknown_keys(ctx.config.engine.extra_llm_api_options):
        yield ConfigError("engine.extra_llm_api_options", describe(key, near), near or "a TorchLlmArgs field")


@rule
def family_matches_checkpoint(ctx: CheckContext) -> Iterator[ConfigError]:
    family = ctx.config.model.family
    if family and ctx.shape and ctx.shape.model_type and ctx.shape.model_type != family:
        yield ConfigError(
            "model.family",
            f"{family!r} but the checkpoint's config.json says model_type {ctx.shape.model_type!r}",
            f"set model.family: {ctx.shape.model_type} or leave it unset to detect it",
        )


@rule
def heads_divisible_by_tp(ctx: CheckContext) -> Iterator[ConfigError]:
    tp = ctx.config.parallel.tp
    if ctx.shape and ctx.shape.num_attention_heads % tp:
        heads = ctx.shape.num_attention_heads
        divisors = [d for d in range(1, heads + 1) if heads % d == 0 and d <= 64]
        yield ConfigError(
            "parallel.tp",
            f"{tp} does not divide the model's {heads} attention heads",
            f"use one of {divisors}",
        )


@rule
def seq_len_within_positions(ctx: CheckContext) -> Iterator[ConfigError]:
    if not ctx.shape or not ctx.shape.max_position_embeddings:
        return
    if ctx.config.model.rope_scaling or ctx.shape.rope_scaling:
        return
    limit = ctx.shape.max_position_embeddings
    if ctx.config.engine.max_seq_len > limit:
        yield ConfigError(
            "engine.max_seq_len",
            f"{ctx.config.engine.max_seq_len} exceeds the model's max_position_embeddings ({limit})",
            f"use at most {limit}, or set model.rope_scaling",
        )


@rule
def quantization_fits_gpu(ctx: CheckContext) -> Iterator[ConfigError]:
    """The TensorRT-LLM spec's compute-capability rules for quantization (builders/tensorrt_llm/quant.py, the same
    check plan_build makes), found at validation time."""
    cc = ctx.compute_capability
    if cc is None or not ctx.is_trtllm:
        return
    from trtllm_forge.builders.tensorrt_llm.quant import capability_problems, choose, sm_of
    from trtllm_forge.builders.tensorrt_llm.spec import load_spec

    quant = ctx.config.quantization
    try:
        spec = load_spec(ctx.config.engine.trtllm_version)
        choice = choose(quant.algorithm, quant.kv_cache, spec)
    except ConfigError:
        return  # an unknown version or algorithm is the build's to report
    yield from capability_problems(choice, sm_of(cc), ctx.device_name, spec, plugin_flags={})


@rule
def cpu_backend_supports(ctx: CheckContext) -> Iterator[ConfigError]:
    if ctx.is_trtllm:
        return
    cfg = ctx.config
    backend = cfg.engine.backend
    limits = CPU_BACKEND_LIMITS[backend]
    if cfg.quantization.algorithm not in limits.algorithms:
        yield ConfigError(
            "quantization.algorithm",
            f"{cfg.quantization.algorithm} is not available on the {backend} backend",
            f"one of {', '.join(sorted(limits.algorithms))}",
        )
    if cfg.quantization.kv_cache not in limits.kv_caches:
        yield ConfigError(
            "quantization.kv_cache",
            f"{cfg.quantization.kv_cache} KV cache is not available on {backend}",
            f"use {' or '.join(limits.kv_caches)}",
        )
    if cfg.parallel.world_size != 1:
        yield ConfigError("parallel.tp", f"the {backend} backend runs one process (tp * pp must be 1)", "set tp: 1 and pp: 1")
    if cfg.engine.max_beam_width != 1:
        yield ConfigError("engine.max_beam_width", "beam search is not served by the CPU engine model", "set 1")
    if cfg.engine.speculative.mode not in limits.speculative_modes:
        yield ConfigError(
            "engine.speculative.mode", f"{cfg.engine.speculative.mode} is not available on {backend}", _one_of(limits.speculative_modes)
        )
    if cfg.engine.backend == "openvino" and cfg.engine.kv_cache_type != "paged":
        yield ConfigError("engine.kv_cache_type", "the openvino engine always uses a paged KV cache", "set paged")
    if cfg.engine.backend == "onnxruntime":
        yield from onnxruntime_only(cfg)


@rule
def int4_group_divides_hidden(ctx: CheckContext) -> Iterator[ConfigError]:
    quant = ctx.config.quantization
    if quant.algorithm not in INT4_ALGOS or not ctx.shape:
        return
    hidden = ctx.shape.hidden_size
    if hidden % quant.group_size:
        good = [g for g in (32, 64, 128) if hidden % g == 0]
        yield ConfigError(
            "quantization.group_size",
            f"{quant.group_size} does not divide the model's hidden size {hidden}",
            f"use one of {good}" if good else "use a divisor of the hidden size",
        )


@rule
def speculative_needs_draft(ctx: CheckContext) -> Iterator[ConfigError]:
    spec = ctx.config.engine.speculative
    if spec.mode in ("draft_target", "eagle", "medusa") and not spec.draft_model:
        what = "a draft model" if spec.mode == "draft_target" else f"the {spec.mode} head checkpoint"
        yield ConfigError("engine.speculative.draft_model", f"mode {spec.mode} needs {what}", "set its path")
    if spec.mode not in ("none", "prompt_lookup") and spec.max_draft_len < 1:
        yield ConfigError("engine.speculative.max_draft_len", f"mode {spec.mode} drafts no tokens with max_draft_len 0", "set 1 or more")
    if spec.mode == "none" and spec.draft_model:
        yield ConfigError("engine.speculative.draft_model", "is set but speculative.mode is none", "set a mode or drop it")


@rule
def speculative_limits(ctx: CheckContext) -> Iterator[ConfigError]:
    cfg = ctx.config
    spec = cfg.engine.speculative
    if spec.mode == "none":
        return
    if cfg.engine.max_beam_width > 1:
        yield ConfigError("engine.max_beam_width", "speculative decoding does not support beam search", "set 1")
    if spec.mode == "eagle" and cfg.engine.max_batch_size > 512:
        yield ConfigError("engine.max_batch_size", "EAGLE supports at most 512", "set <= 512")
    if spec.mode == "eagle" and cfg.parallel.pp > 1:
        yield ConfigError("parallel.pp", "EAGLE does not support pipeline parallelism", "set pp: 1")
    if ctx.is_trtllm:
        needed = cfg.engine.max_batch_size * (spec.max_draft_len + 1)
        if cfg.engine.resolved_max_num_tokens < needed:
            yield ConfigError(
                "engine.max_num_tokens",
                f"{cfg.engine.resolved_max_num_tokens} is below max_batch_size * (max_draft_len + 1) = {needed}",
                f"set at least {needed}",
            )
        if cfg.engine.gather_logits.context and spec.mode == "draft_target":
            yield ConfigError("engine.gather_logits.context", "cannot be combined with draft tokens", "set false")
        if spec.mode in ("draft_target", "eagle") and not cfg.engine.plugins.paged_context_fmha:
            yield ConfigError("engine.plugins.paged_context_fmha", f"{spec.mode} decoding needs paged context FMHA", "set true")
    elif spec.mode == "draft_target" and cfg.engine.max_num_tokens is not None and cfg.engine.max_num_tokens < 2048:
        # OpenVINO GenAI emits wrong tokens with speculative decoding plus chunked prefill.
        yield ConfigError(
            "engine.max_num_tokens",
            "speculative decoding with chunked prefill (max_num_tokens < 2048) gives wrong tokens on openvino",
            "set max_num_tokens >= 2048 or leave it unset",
        )


@rule
def reuse_needs_paged_context_fmha(ctx: CheckContext) -> Iterator[ConfigError]:
    cfg = ctx.config
    if not ctx.is_trtllm:
        return
    paged_fmha = cfg.engine.plugins.paged_context_fmha
    for field in ("enable_kv_cache_reuse", "enable_chunked_context"):
        if getattr(cfg.runtime, field) and not paged_fmha:
            yield ConfigError(
                f"runtime.{field}",
                "needs an engine built with paged context FMHA",
                "set engine.plugins.paged_context_fmha: true",
            )
        if getattr(cfg.runtime, field) and cfg.quantization.kv_cache == "int8":
            yield ConfigError(
                f"runtime.{field}",
                "is impossible with an int8 KV cache (it turns paged context FMHA off)",
                "use kv_cache fp8 or none, or turn this off",
            )


@rule
def paged_kv_required(ctx: CheckContext) -> Iterator[ConfigError]:
    cfg = ctx.config
    if cfg.engine.kv_cache_type != "paged" and ctx.is_trtllm and cfg.runtime.batching_strategy == "inflight_fused_batching":
        yield ConfigError(
            "engine.kv_cache_type",
            f"{cfg.engine.kv_cache_type} KV cache cannot serve in-flight batching",
            "set paged, or runtime.batching_strategy: V1",
        )


@rule
def world_fits_cluster(ctx: CheckContext) -> Iterator[ConfigError]:
    par = ctx.config.parallel
    capacity = par.gpus_per_node * par.nodes
    if par.world_size > capacity:
        yield ConfigError(
            "parallel",
            f"tp * pp = {par.world_size} exceeds gpus_per_node * nodes = {capacity}",
            "lower tp/pp or add nodes",
        )
    count = ctx.config.hardware.count
    if count is not None and par.world_size > count:
        yield ConfigError("hardware.count", f"{count} devices cannot hold tp * pp = {par.world_size} ranks", "raise it")


@rule
def moe_parallel_consistent(ctx: CheckContext) -> Iterator[ConfigError]:
    par = ctx.config.parallel
    if par.moe_ep is None and par.moe_tp is None:
        return
    if ctx.shape and not ctx.shape.is_moe:
        yield ConfigError("parallel.moe_ep", "is set but the model has no experts", "drop moe_ep/moe_tp")
        return
    ep = par.moe_ep or 1
    moe_tp = par.moe_tp or (par.tp // ep if par.tp % ep == 0 else 0)
    if ep * moe_tp != par.tp:
        yield ConfigError(
            "parallel.moe_ep",
            f"moe_ep ({ep}) * moe_tp ({par.moe_tp if par.moe_tp else moe_tp}) must equal tp ({par.tp})",
            "choose moe_ep and moe_tp whose product is tp",
        )
    if ctx.shape and ctx.shape.num_local_experts % ep:
        yield ConfigError("parallel.moe_ep", f"{ep} does not divide the model's {ctx.shape.num_local_experts} experts", "use a divisor")


@rule
def streaming_needs_decoupled(ctx: CheckContext) -> Iterator[ConfigError]:
    if ctx.config.runtime.streaming and not ctx.config.triton.decoupled:
        yield ConfigError("runtime.streaming", "streaming needs triton.decoupled: true", "set triton.decoupled: true or streaming: false")


@rule
def gather_logits_needs_trtllm(ctx: CheckContext) -> Iterator[ConfigError]:
    gl = ctx.config.engine.gather_logits
    if not ctx.is_trtllm and (gl.context or gl.generation):
        yield ConfigError("engine.gather_logits", "logits are not returned by the CPU engine model", "set both false")


@rule
def builtin_source_known(ctx: CheckContext) -> Iterator[ConfigError]:
    source = ctx.config.model.source
    looks_like_a_name = "/" not in source and "." not in source
    if looks_like_a_name and source not in BUILTIN_SOURCES and not ctx.config.resolve_path(source).exists():
        yield ConfigError(
            "model.source",
            f"{source!r} is neither a path nor a built-in model",
            f"built-in models: {', '.join(BUILTIN_SOURCES)}; or a path to a HF directory or .gguf file",
        )


def shape_for(config: ForgeConfig) -> ModelShape | None:
    source = config.model.source
    path_or_name = source if source in BUILTIN_SOURCES else config.resolve_path(source)
    return resolve_shape(path_or_name, config.model.name)


def check_config(config: ForgeConfig) -> list[ConfigError]:
    ctx = CheckContext(config=config, shape=shape_for(config), device=find_device(config.hardware.gpu))
    return [problem for check in RULES.values() for problem in check(ctx)]


def onnxruntime_only(cfg: ForgeConfig) -> Iterator[ConfigError]:
    """Settings only the ONNX Runtime GenAI engine refuses: it keeps a contiguous KV cache per sequence and has no
    LLM-API stand-in."""
    if cfg.engine.target != "engine":
        yield ConfigError(
            "engine.target", "the CPU LLM-API stand-in serves OpenVINO IR, not an onnxruntime engine", "set engine.target: engine"
        )
    for flag in ("enable_kv_cache_reuse", "enable_chunked_context"):
        if getattr(cfg.runtime, flag):
            yield ConfigError(f"runtime.{flag}", "the onnxruntime engine keeps a contiguous KV cache per sequence", "set false")
