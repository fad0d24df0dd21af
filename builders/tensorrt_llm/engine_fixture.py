"""The engine config.json a plan is expected to produce, in TensorRT-LLM 1.2.x's shape.

Used to write realistic test fixtures (tests/fixtures/engines/) and to diff against the config.json a
real build records. Values the build adjusts silently are taken from the plan's `effective` values.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trtllm_forge.builders.tensorrt_llm.plan import BuildPlan
    from trtllm_forge.builders.tensorrt_llm.spec import Spec

# build_config.speculative_decoding_mode as the 1.x builder serializes it (an IntFlag value).
SPECULATIVE_FLAG = {None: 1, "draft_tokens_external": 2, "medusa": 4, "lookahead_decoding": 8, "explicit_draft_tokens": 16, "eagle": 32}
NORM_EPSILON = {"qwen2": 1e-6}


def _plugin_config(plan: BuildPlan) -> dict:
    spec_defaults = {key: None for key in _spec(plan).engine_config["plugin_config_keys"]}
    eff = plan.effective
    assert eff is not None  # engine-target plans always have one
    flags = plan.build_flags
    dtype = plan.dtype
    algo = plan.quant.quant_algo or ""
    toggles = eff.toggles
    config = {
        **spec_defaults,
        "dtype": dtype,
        "bert_attention_plugin": "auto",
        "gpt_attention_plugin": flags.get("--gpt_attention_plugin", "auto"),
        "gemm_plugin": eff.plugin_values["gemm_plugin"],
        "gemm_swiglu_plugin": flags.get("--gemm_swiglu_plugin"),
        "low_latency_gemm_plugin": flags.get("--low_latency_gemm_plugin"),
        "nccl_plugin": eff.plugin_values["nccl_plugin"] and dtype,
        "lora_plugin": flags.get("--lora_plugin"),
        "dora_plugin": False,
        "moe_plugin": flags.get("--moe_plugin", "auto"),
        "mamba_conv1d_plugin": "auto",
        "weight_only_quant_matmul_plugin": dtype if algo in ("W8A16", "W4A16") else None,
        "weight_only_groupwise_quant_matmul_plugin": dtype if algo in ("W4A16_AWQ", "W4A8_AWQ") else None,
        "smooth_quant_plugins": True,
        "smooth_quant_gemm_plugin": dtype if algo.startswith("W8A8_SQ") else None,
        "rmsnorm_quantization_plugin": dtype if algo.startswith("W8A8_SQ") else None,
        "quantize_per_token_plugin": False,
        "quantize_tensor_plugin": False,
        "context_fmha": toggles["context_fmha"],
        "bert_context_fmha_fp32_acc": False,
        "paged_kv_cache": True,
        "remove_input_padding": toggles["remove_input_padding"],
        "norm_quant_fusion": False,
        "reduce_fusion": toggles["reduce_fusion"],
        "user_buffer": toggles["user_buffer"],
        "tokens_per_block": plan.requested["tokens_per_block"],
        "use_paged_context_fmha": toggles["use_paged_context_fmha"],
        "use_fp8_context_fmha": toggles["use_fp8_context_fmha"],
        "fuse_fp4_quant": toggles["fuse_fp4_quant"],
        "multiple_profiles": toggles["multiple_profiles"],
        "paged_state": False,
        "streamingllm": False,
        "manage_weights": False,
        "use_fused_mlp": toggles["use_fused_mlp"],
        "pp_reduce_scatter": False,
    }
    return {key: (None if value == "disable" else value) for key, value in config.items()}


def _spec(plan: BuildPlan) -> Spec:
    from trtllm_forge.builders.tensorrt_llm.spec import load_spec

    return load_spec(plan.trtllm_version)


def expected_engine_config(plan: BuildPlan) -> dict:
    if plan.target != "engine" or plan.effective is None:
        raise ValueError("only engine plans produce an engine config.json")
    spec = _spec(plan)
    shape = plan.shape
    eff = plan.effective
    if shape is None:
        raise ValueError("the model shape is unknown (no local config.json and no catalog entry)")
    quantization = dict(spec.engine_config["quantization_keys"])
    quantization.update({"quant_algo": plan.quant.quant_algo, "kv_cache_quant_algo": plan.quant.kv_cache_quant_algo})
    if plan.quant.quant_algo in ("W4A16_AWQ", "W4A8_AWQ"):
        quantization["has_zero_point"] = False
        quantization["pre_quant_scale"] = True
    if plan.quant.quant_algo == "FP8":
        quantization["exclude_modules"] = ["lm_head"]
    moe_ep = 1
    moe_tp = plan.tp
    for arg_list in (s.argv for s in plan.steps):
        if "--moe_ep_size" in arg_list:
            moe_ep = int(arg_list[arg_list.index("--moe_ep_size") + 1])
        if "--moe_tp_size" in arg_list:
            moe_tp = int(arg_list[arg_list.index("--moe_tp_size") + 1])
    mapping = {
        "world_size": plan.world_size,
        "gpus_per_node": min(8, plan.world_size) if plan.world_size > 1 else 8,
        "cp_size": 1,
        "tp_size": plan.tp,
        "pp_size": plan.pp,
        "moe_tp_size": moe_tp if shape.is_moe else plan.tp,
        "moe_cluster_size": 1,
        "moe_ep_size": moe_ep if shape.is_moe else 1,
        "attn_tp_size": plan.tp,
        "attn_cp_size": 1,
        "cp_config": {},
        "enable_attention_dp": False,
        "enable_lm_head_tp_in_adp": False,
    }
    eagle = eff.speculative_decoding_mode == "eagle"
    pretrained = {
        "architecture": "EagleForCausalLM" if eagle else plan.architecture,
        "dtype": plan.dtype,
        "logits_dtype": "float32",
        "vocab_size": shape.vocab_size,
        "hidden_size": shape.hidden_size,
        "num_hidden_layers": shape.num_hidden_layers,
        "num_attention_heads": shape.num_attention_heads,
        "num_key_value_heads": shape.num_key_value_heads,
        "hidden_act": "silu",
        "intermediate_size": shape.intermediate_size,
        "max_position_embeddings": shape.max_position_embeddings,
        "norm_epsilon": NORM_EPSILON.get(shape.model_type, 1e-5),
        "position_embedding_type": "rope_gpt_neox",
        "head_size": shape.head_dim,
        "rotary_embedding_dim": shape.head_dim,
        "rotary_scaling": shape.rope_scaling,
        "use_parallel_embedding": False,
        "embedding_sharding_dim": 0,
        "qk_layernorm": False,
        "runtime_defaults": None,
        "mapping": mapping,
        "quantization": quantization,
    }
    if shape.is_moe:
        pretrained["moe"] = {
            "num_experts": shape.num_local_experts,
            "top_k": shape.num_experts_per_tok,
            "normalization_mode": 1,
            "sparse_mixer_epsilon": 0.01,
            "tp_mode": 0,
        }
    if eagle:
        pretrained.update({"max_draft_len": eff.max_draft_len, "num_eagle_layers": 4, "max_non_leaves_per_layer": 10})
    defaults = dict(spec.engine_config["build_config_defaults"])
    build = {key: defaults.get(key) for key in spec.engine_config["build_config_keys"]}
    build.update(
        {
            "max_input_len": eff.max_input_len,
            "max_seq_len": eff.max_seq_len,
            "max_batch_size": eff.max_batch_size,
            "max_beam_width": eff.max_beam_width,
            "max_num_tokens": eff.max_num_tokens,
            "opt_num_tokens": eff.opt_num_tokens,
            "kv_cache_type": str(plan.build_flags.get("--kv_cache_type", "paged")).upper(),
            "gather_context_logits": "--gather_context_logits" in plan.build_flags,
            "gather_generation_logits": "--gather_generation_logits" in plan.build_flags,
            "strongly_typed": True,
            "max_draft_len": eff.max_draft_len,
            "speculative_decoding_mode": SPECULATIVE_FLAG[eff.speculative_decoding_mode],
            "output_timing_cache": "model.cache",
            "lora_config": {
                **spec.engine_config["lora_config_keys"],
                "max_lora_rank": int(plan.build_flags.get("--max_lora_rank", 64)),
                "lora_target_modules": plan.build_flags.get("--lora_target_modules", "").split(),
            },
            "plugin_config": _plugin_config(plan),
        }
    )
    return {"version": plan.trtllm_version, "pretrained_config": pretrained, "build_config": build}
