"""Cross-field rules: combinations that each field alone allows but the build or the server would reject.

Each rule is a small function registered in RULES; it yields ConfigError for every problem it finds.
Rules that need the model's shape or the GPU's capability are skipped when those are unknown.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from trtllm_forge.builders.descriptor import EngineDescriptor
from trtllm_forge.builders.engines import BACKENDS, CPU_BACKENDS, engine_of
from trtllm_forge.config import nvidia_lint
from trtllm_forge.config.schema import ForgeConfig
from trtllm_forge.errors import ConfigError
from trtllm_forge.hardware import Device, find_device, hardware_table
from trtllm_forge.model_shape import BUILTIN_SOURCES, ModelShape, resolve_shape
from trtllm_forge.server_kinds import SERVER_KINDS


@dataclass(frozen=True)
class CheckContext:
    config: ForgeConfig
    shape: ModelShape | None
    device: Device | None

    @property
    def engine(self) -> EngineDescriptor:
        return engine_of(self.config.engine.backend)

    @property
    def is_trtllm(self) -> bool:
        """TensorRT-LLM's own rules (plugins, in-flight batching, draft lengths) apply: the GPU engine."""
        return not self.engine.on_cpu

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


INT4_ALGOS = {"int4_wo", "int4_awq", "w4a8_awq"}


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
    backend = ctx.config.engine.backend
    if not ctx.engine.on_cpu and not ctx.device.is_gpu:
        yield ConfigError(
            "engine.backend",
            f"{backend} needs an NVIDIA GPU but hardware.gpu is 'cpu'",
            f"set hardware.gpu to the target GPU (e.g. H100-SXM) or use engine.backend: {' or '.join(CPU_BACKENDS)}",
        )
    if ctx.engine.on_cpu and ctx.device.is_gpu:
        gpu_backends = " or ".join(b for b in BACKENDS if b not in CPU_BACKENDS)
        yield ConfigError(
            "engine.backend",
            f"{backend} runs on the CPU but hardware.gpu is {ctx.device_name!r}",
            f"set hardware.gpu: cpu, or engine.backend: {gpu_backends}",
        )


def _server_kind_rule(server: str, reference: str) -> Rule:
    """A rule of a server kind ("module:function" in its SERVER_KINDS entry), applied to the configs whose
    deploy.server is that kind; its module (deploy/kinds/) is loaded when a config with that kind is checked."""
    module_name, _, function_name = reference.partition(":")

    def applied(ctx: CheckContext) -> Iterator[ConfigError]:
        if ctx.config.deploy.server == server:
            yield from getattr(importlib.import_module(module_name), function_name)(ctx.config)

    applied.__name__ = function_name
    return applied


for _entry in SERVER_KINDS:
    for _reference in _entry.config_rules:
        rule(_server_kind_rule(_entry.name, _reference))


@rule
def llm_api_options_known(ctx: CheckContext) -> Iterator[ConfigError]:
    """Keys the LLM API would refuse at LLM() time, found before any GPU time (llmapi_args holds each version's table)."""
    from trtllm_forge.llmapi_args import describe, table_of, unknown_keys

    version = table_of(ctx.config.engine.llmapi_version, ctx.config.deploy.server).version
    for problem in unknown_keys(ctx.config.engine.extra_llm_api_options, version=version):
        yield ConfigError("engine.extra_llm_api_options", describe(problem, version), problem.near or "a TorchLlmArgs field")


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
def backend_rules(ctx: CheckContext) -> Iterator[ConfigError]:
    """The engine's own rules, declared by its package (descriptor `config_rules`), e.g. TensorRT-LLM's GPU
    compute-capability limits of each quantization (builders/tensorrt_llm/rules.py)."""
    reference = ctx.engine.config_rules
    if reference is None:
        return
    module_name, _, function_name = reference.partition(":")
    engine_rules: Rule = getattr(importlib.import_module(module_name), function_name)
    yield from engine_rules(ctx)


@rule
def cpu_backend_supports(ctx: CheckContext) -> Iterator[ConfigError]:
    """What the CPU engine serves, from its descriptor's limits (builders/<name>/engine.py)."""
    limits = ctx.engine.limits
    if limits is None:
        return
    cfg = ctx.config
    backend = cfg.engine.backend
    if cfg.engine.target not in ctx.engine.builders:
        yield ConfigError(
            "engine.target",
            f"the {backend} backend has no {cfg.engine.target} build (the CPU LLM-API stand-in serves OpenVINO IR)",
            f"set engine.target: {' or '.join(ctx.engine.builders)}",
        )
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
    if cfg.engine.kv_cache_type not in limits.kv_cache_types:
        yield ConfigError("engine.kv_cache_type", f"the {backend} engine {limits.kv_cache_layout}", _one_of(limits.kv_cache_types))
    for flag in limits.refused_runtime:
        if getattr(cfg.runtime, flag):
            yield ConfigError(f"runtime.{flag}", f"the {backend} engine {limits.kv_cache_layout}", "set false")


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


# NVIDIA's LLM-API validators and the known deployment breakers, as lint (config/nvidia_lint.py names each source).
rule(nvidia_lint.nvidia_llm_api_lint)


def shape_for(config: ForgeConfig) -> ModelShape | None:
    source = config.model.source
    path_or_name = source if source in BUILTIN_SOURCES else config.resolve_path(source)
    return resolve_shape(path_or_name, config.model.name)


def check_config(config: ForgeConfig) -> list[ConfigError]:
    ctx = CheckContext(config=config, shape=shape_for(config), device=find_device(config.hardware.gpu))
    return [problem for check in RULES.values() for problem in check(ctx)]
