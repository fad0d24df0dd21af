"""The values trtllm-build 1.2.x would change without failing, computed before the build.

`effective_build(...)` returns the build values and plugin toggles the engine will really record, plus one
`PlanWarning` per change, so the user sees them before any GPU time instead of diffing config.json after.
"""

from __future__ import annotations

from dataclasses import dataclass

from trtllm_forge.builders.tensorrt_llm.quant import QuantChoice, plain
from trtllm_forge.builders.tensorrt_llm.spec import Spec

from trtllm_forge.config.schema import ForgeConfig
from trtllm_forge.model_shape import ModelShape

EAGLE_NUM_LAYERS = 4
EAGLE_MAX_NON_LEAVES = 10
# rope types whose scaling factor trtllm-build ignores when it deduces max_seq_len
FACTOR_IGNORED_ROPE = {"su", "longrope", "llama3"}


@dataclass(frozen=True)
class PlanWarning:
    code: str
    field: str
    message: str

    def to_dict(self) -> dict:
        return {"code": self.code, "field": self.field, "message": self.message}


@dataclass
class Effective:
    """What the engine's build_config will hold after trtllm-build's own adjustments."""

    max_batch_size: int
    max_input_len: int
    max_seq_len: int
    max_num_tokens: int
    opt_num_tokens: int | None
    max_beam_width: int
    max_draft_len: int
    speculative_decoding_mode: str | None  # trtllm-build flag value
    toggles: dict[str, bool]  # plugin feature → on/off after adjustment
    plugin_values: dict[str, str | None]  # dtype-valued plugins after adjustment (None = off)
    runtime_max_input_len: int


def _on(flags: dict[str, str], name: str, default: bool = False) -> bool:
    value = flags.get(f"--{name}")
    return default if value is None else value == "enable"


def effective_build(
    config: ForgeConfig,
    shape: ModelShape | None,
    sm: int,
    architecture: str,
    choice: QuantChoice,
    flags: dict[str, str],
    spec: Spec,
) -> tuple[Effective, list[PlanWarning]]:
    eng, par = config.engine, config.parallel
    spec_cfg = eng.speculative
    mode_name = plain(spec_cfg.mode)
    adj = spec.adjustments
    cap = spec.capability
    warnings: list[PlanWarning] = []

    def warn(code: str, field: str, message: str) -> None:
        warnings.append(PlanWarning(code, field, message))

    # --- plugin and fusion toggles -------------------------------------------------------------
    context_fmha = _on(flags, "context_fmha", True)
    paged_fmha = _on(flags, "use_paged_context_fmha", True)
    fp8_fmha = _on(flags, "use_fp8_context_fmha", True)
    if not context_fmha and (paged_fmha or fp8_fmha):
        warn(
            "context_fmha_off",
            "engine.plugins.context_fmha",
            "context FMHA is off, so trtllm-build also turns paged context FMHA and FP8 context FMHA off",
        )
        paged_fmha = fp8_fmha = False
    if choice.kv_cache_quant_algo == "INT8" and paged_fmha:
        warn(
            "int8_kv_disables_paged_context_fmha",
            "engine.plugins.paged_context_fmha",
            "an INT8 KV cache switches paged context FMHA off: no KV-cache reuse and no chunked context on this engine",
        )
        paged_fmha = False
    if mode_name == "eagle" and not paged_fmha and choice.kv_cache_quant_algo != "INT8":
        warn("eagle_forces_paged_context_fmha", "engine.plugins.paged_context_fmha", "EAGLE forces paged context FMHA on")
        paged_fmha = True
    fp8_allowed = choice.quant_algo in cap["fp8_context_fmha_algos"] and sm >= cap["fp8_context_fmha_min_sm"]
    if fp8_fmha and not fp8_allowed:
        if eng.plugins.fp8_context_fmha:
            warn(
                "fp8_context_fmha_off",
                "engine.plugins.fp8_context_fmha",
                f"FP8 context FMHA is kept only for FP8, W4A8_AWQ or NVFP4 on SM >= 89; it is switched off "
                f"(quant_algo {choice.quant_algo or 'none'}, SM {sm})",
            )
        fp8_fmha = False
    if paged_fmha and choice.kv_cache_quant_algo == "FP8" and not fp8_fmha and context_fmha:
        warn(
            "fp8_kv_forces_fp8_context_fmha",
            "engine.plugins.fp8_context_fmha",
            "paged context FMHA with an FP8 KV cache forces FP8 context FMHA on",
        )
        fp8_fmha = True
    if choice.quant_algo in ("W4A16_AWQ", "W4A8_AWQ") and choice.kv_cache_quant_algo == "FP8" and paged_fmha:
        warn(
            "awq_fp8kv_paged_fmha_kernels",
            "engine.plugins.paged_context_fmha",
            "INT4 AWQ with an FP8 KV cache and paged context FMHA has failed with 'FMHA kernels are not found'; "
            "set paged_context_fmha: false if the build fails",
        )

    reduce_fusion = _on(flags, "reduce_fusion")
    if reduce_fusion and not (par.tp > 1 and architecture in adj["reduce_fusion_architectures"]):
        warn(
            "reduce_fusion_off",
            "engine.fusion.reduce_fusion",
            f"reduce_fusion is kept only with tp > 1 on {', '.join(adj['reduce_fusion_architectures'])}; "
            f"switched off for {architecture} with tp {par.tp}",
        )
        reduce_fusion = False
    user_buffer = _on(flags, "user_buffer")
    if user_buffer and not reduce_fusion:
        warn("user_buffer_off", "engine.fusion.user_buffer", "user_buffer needs reduce_fusion; switched off")
        user_buffer = False
    fused_mlp = True
    if choice.quant_algo not in adj["fused_mlp_algos"]:
        warn(
            "fused_mlp_off",
            "engine.quantization",
            f"use_fused_mlp is switched off for {choice.quant_algo} (kept only unquantized, FP8 or mixed precision)",
        )
        fused_mlp = False
    remove_padding = _on(flags, "remove_input_padding", True)

    # --- dtype-valued plugins --------------------------------------------------------------------
    gemm = flags.get("--gemm_plugin")
    if choice.quant_algo == "NVFP4" and gemm not in ("nvfp4", "disable"):
        warn("nvfp4_gemm_plugin", "engine.plugins.gemm", f"NVFP4 forces gemm_plugin nvfp4 (asked for {gemm})")
        gemm = "nvfp4"
    nccl = flags.get("--nccl_plugin")
    world = par.world_size
    if world > 1 and nccl == "disable":
        warn("nccl_plugin_forced", "engine.plugins.nccl", f"world size {world} > 1: trtllm-build sets nccl_plugin to the model dtype")
        nccl = "auto"
    if world == 1 and nccl not in (None, "disable"):
        warn("nccl_plugin_unused", "engine.plugins.nccl", "world size 1: trtllm-build turns nccl_plugin off")
        nccl = None
    weight_only = choice.quant_algo in ("W8A16", "W4A16", "W4A16_AWQ", "W4A8_AWQ")
    if weight_only:
        warn(
            "weight_only_plugins",
            "quantization.algorithm",
            f"{choice.quant_algo}: trtllm-build switches the weight-only / groupwise matmul plugins on",
        )
    if choice.quant_algo and choice.quant_algo.startswith("W8A8_SQ"):
        warn("smoothquant_plugins", "quantization.algorithm", "SmoothQuant: trtllm-build switches the SmoothQuant plugins on")

    # --- sizes ------------------------------------------------------------------------------------
    batch = eng.max_batch_size
    seq = eng.max_seq_len
    if shape and shape.max_position_embeddings:
        rope = config.model.rope_scaling or shape.rope_scaling or {}
        rope_type = str(rope.get("rope_type") or rope.get("type") or "")
        factor = 1.0 if rope_type in FACTOR_IGNORED_ROPE else float(rope.get("factor") or 1.0)
        deduced = int(shape.max_position_embeddings * factor)
        if seq > deduced:
            warn(
                "max_seq_len_above_positions",
                "engine.max_seq_len",
                f"{seq} is above max_position_embeddings x rope factor ({deduced}); trtllm-build only warns",
            )
    input_len = eng.max_input_len
    if input_len > seq:
        warn("max_input_len_clipped", "engine.max_input_len", f"{input_len} is clipped to max_seq_len {seq}")
        input_len = seq
    modes = spec.speculative_build_modes
    draft = spec_cfg.max_draft_len if mode_name in modes else 0
    mode = modes.get(mode_name)
    if mode_name == "eagle" and draft > adj["eagle_max_draft_len"]:
        warn("eagle_draft_len", "engine.speculative.max_draft_len", f"EAGLE asserts max_draft_len <= {adj['eagle_max_draft_len']}")
    if draft:
        extra = draft + (EAGLE_NUM_LAYERS if mode_name == "eagle" else 0)
        warn(
            "speculative_extends_max_seq_len",
            "engine.max_seq_len",
            f"speculative decoding adds {extra} to max_seq_len: the engine records {seq + extra}",
        )
        seq += extra
    tokens = eng.resolved_max_num_tokens
    if not remove_padding:
        warn(
            "max_num_tokens_padded",
            "engine.max_num_tokens",
            f"without remove_input_padding max_num_tokens becomes max_batch_size x max_seq_len = {batch * seq}",
        )
        tokens = batch * seq
    if tokens > adj["max_num_tokens_warn_above"]:
        warn(
            "max_num_tokens_large",
            "engine.max_num_tokens",
            f"{tokens} is above {adj['max_num_tokens_warn_above']} and may exceed TensorRT's tensor volume limit",
        )
    if tokens > batch * seq:
        warn("max_num_tokens_clipped", "engine.max_num_tokens", f"{tokens} is clipped to max_batch_size x max_seq_len = {batch * seq}")
        tokens = batch * seq
    if context_fmha and tokens < eng.tokens_per_block:
        warn(
            "max_num_tokens_raised",
            "engine.max_num_tokens",
            f"{tokens} is raised to tokens_per_block ({eng.tokens_per_block}); context chunking must be on at runtime",
        )
        tokens = eng.tokens_per_block
    runtime_input = input_len
    chunked = config.runtime.enable_chunked_context and paged_fmha
    if remove_padding and context_fmha and not chunked:
        runtime_input = min(seq - 1, tokens)
        if runtime_input < input_len:
            warn(
                "runtime_input_capped",
                "engine.max_input_len",
                f"without chunked context the longest prompt at runtime is min(max_seq_len - 1, max_num_tokens) = "
                f"{runtime_input}, below max_input_len {input_len}; enable runtime.enable_chunked_context or raise max_num_tokens",
            )
    opt_tokens = None if _on(flags, "multiple_profiles") else min(batch * eng.max_beam_width, tokens)

    effective = Effective(
        max_batch_size=batch,
        max_input_len=input_len,
        max_seq_len=seq,
        max_num_tokens=tokens,
        opt_num_tokens=opt_tokens,
        max_beam_width=eng.max_beam_width,
        max_draft_len=draft,
        speculative_decoding_mode=mode,
        toggles={
            "context_fmha": context_fmha,
            "use_paged_context_fmha": paged_fmha,
            "use_fp8_context_fmha": fp8_fmha,
            "remove_input_padding": remove_padding,
            "reduce_fusion": reduce_fusion,
            "user_buffer": user_buffer,
            "use_fused_mlp": fused_mlp,
            "multiple_profiles": _on(flags, "multiple_profiles"),
            "fuse_fp4_quant": _on(flags, "fuse_fp4_quant"),
        },
        plugin_values={
            "gemm_plugin": None if gemm in (None, "disable") else gemm,
            "nccl_plugin": None if nccl in (None, "disable") else nccl,
        },
        runtime_max_input_len=runtime_input,
    )
    return effective, warnings
