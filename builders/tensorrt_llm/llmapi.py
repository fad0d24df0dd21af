"""The LLM-API side of the same config: the TensorRT-engine LLM call equivalent to a build plan, and the
PyTorch-backend deployment (Triton `llmapi` model.yaml, `trtllm-serve` argv, extra LLM-API options YAML)
that TensorRT-LLM >= 1.3 uses instead of engines.

Field names follow TensorRT-LLM's LLM-API argument classes as of the 1.2 timeframe (the reference notes
that some come from a newer main branch).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtllm_forge.config.schema import ForgeConfig
from trtllm_forge.errors import ConfigError
from trtllm_forge.llmapi_args import VersionTable, describe, table_of, unknown_keys

if TYPE_CHECKING:
    from trtllm_forge.builders.tensorrt_llm.plan import BuildPlan


SCHEDULER_POLICY = {"max_utilization": "MAX_UTILIZATION", "guaranteed_no_evict": "GUARANTEED_NO_EVICT"}


def version_table(config: ForgeConfig) -> VersionTable:
    return table_of(config.engine.llmapi_version, config.deploy.server)


def _kv_cache_config(config: ForgeConfig, pytorch: bool) -> dict:
    rt = config.runtime
    kv: dict[str, Any] = {
        "free_gpu_memory_fraction": rt.kv_cache_free_gpu_mem_fraction,
        "enable_block_reuse": rt.enable_kv_cache_reuse,
        "tokens_per_block": config.engine.tokens_per_block,
    }
    if rt.max_tokens_in_paged_kv_cache:
        kv["max_tokens"] = rt.max_tokens_in_paged_kv_cache
    if pytorch and config.quantization.kv_cache != "none":
        kv["dtype"] = config.quantization.kv_cache  # PyTorch backend only; the engine path bakes it into the checkpoint
    return kv


def _speculative_pytorch(config: ForgeConfig) -> dict | None:
    """speculative_config spelled for the config's LLM-API version (decoding_type and the draft checkpoint's key)."""
    sp, table = config.engine.speculative, version_table(config)
    if sp.mode == "none":
        return None
    if sp.mode not in table.decoding_types:
        raise ConfigError(
            "engine.speculative.mode",
            f"{sp.mode} is not available on the PyTorch backend (llmapi target)",
            f"one of none, {', '.join(table.decoding_types)}",
        )
    if sp.choices is not None:
        # EagleDecodingConfig resets max_draft_len to the tree's depth and NVIDIA deprecates static trees (release 1.4):
        # refused rather than passed on or dropped.
        raise ConfigError(
            "engine.speculative.choices",
            "a static EAGLE/Medusa choice tree is not passed to the LLM API (eagle_choices is deprecated for removal "
            "in TensorRT-LLM 1.4 and overrides max_draft_len with the tree's depth)",
            "remove it; set engine.speculative.max_draft_len (a linear draft)",
        )
    out: dict[str, Any] = {"decoding_type": table.decoding_types[sp.mode], "max_draft_len": sp.max_draft_len}
    if sp.draft_model:
        out[table.draft_model_key] = str(config.resolve_path(sp.draft_model))
    if sp.mode == "prompt_lookup":
        out["max_matching_ngram_size"] = 3
    return out


def dropped_field_problems(config: ForgeConfig) -> list[tuple[str, str]]:
    """(field, why) for each config field the LLM-API path does not use, so none is dropped silently."""
    problems: list[tuple[str, str]] = []
    if config.runtime.decoding_mode != "auto":
        problems.append(("runtime.decoding_mode", "the LLM API picks its decoder from speculative_config and sampling; not written"))
    plugins = config.engine.plugins
    defaults = type(plugins)()
    for name in type(plugins).model_fields:
        if name != "custom_libraries" and getattr(plugins, name) != getattr(defaults, name):
            problems.append((f"engine.plugins.{name}", "a trtllm-build setting; the PyTorch backend builds no TensorRT network"))
    return problems


def llm_api_options(config: ForgeConfig) -> dict:
    """LLM() arguments for the PyTorch backend: the `--extra_llm_api_options` YAML and model.yaml body."""
    eng, par = config.engine, config.parallel
    options: dict = {
        "backend": "pytorch",
        "tensor_parallel_size": par.tp,
        "pipeline_parallel_size": par.pp,
        "max_batch_size": eng.max_batch_size,
        "max_num_tokens": eng.resolved_max_num_tokens,
        "max_seq_len": eng.max_seq_len,
        "max_beam_width": eng.max_beam_width,
        "enable_chunked_prefill": config.runtime.enable_chunked_context,
        "kv_cache_config": _kv_cache_config(config, pytorch=True),
        "scheduler_config": {"capacity_scheduler_policy": SCHEDULER_POLICY[config.runtime.scheduler_policy]},
    }
    if config.model.dtype != "auto":
        options["dtype"] = config.model.dtype
    if par.moe_ep is not None:
        options["moe_expert_parallel_size"] = par.moe_ep
    if par.moe_tp is not None:
        options["moe_tensor_parallel_size"] = par.moe_tp
    speculative = _speculative_pytorch(config)
    if speculative:
        options["speculative_config"] = speculative
    if config.model.trust_remote_code:
        options["trust_remote_code"] = True
    return _merge(options, config.engine.extra_llm_api_options)


def _merge(base: dict, extra: dict) -> dict:
    merged = dict(base)
    for key, value in extra.items():
        merged[key] = _merge(merged[key], value) if isinstance(value, dict) and isinstance(merged.get(key), dict) else value
    return merged


def model_yaml(config: ForgeConfig, model_path: str) -> dict:
    """The Triton `llmapi` model's model.yaml: LLM() arguments plus the triton_config overrides.

    `model` is the checkpoint (GPU) or, for engine.backend openvino, the OpenVINO IR the CPU stand-in loads."""
    body = {"model": model_path, **llm_api_options(config)}
    if config.engine.backend == "openvino":
        # The stand-in has no GPU memory to size from; the KV cache is max_tokens_in_paged_kv_cache tokens.
        body["kv_cache_config"].pop("free_gpu_memory_fraction", None)
    version = version_table(config).version
    problems = unknown_keys(body, version=version)
    if problems:
        raise ConfigError("engine.extra_llm_api_options", describe(problems[0], version), "a TorchLlmArgs field")
    body["triton_config"] = {"max_batch_size": 0, "decoupled": config.triton.decoupled}
    return body


def write_model_yaml(config: ForgeConfig, directory: Path, model_path: str) -> Path:
    import yaml

    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "model.yaml"
    path.write_text(
        "# LLM() arguments for TensorRT-LLM's LLM API (every top-level key except triton_config).\n"
        "# Rendered by trtllm-forge from the config.\n" + yaml.safe_dump(model_yaml(config, model_path), sort_keys=False)
    )
    return path


def serve_argv(config: ForgeConfig, model_path: str, options_file: str) -> list[str]:
    """trtllm-serve's command line in the config's LLM-API version's spellings (1.3: --config for the options file)."""
    eng, par, tr, table = config.engine, config.parallel, config.triton, version_table(config)
    argv = [
        "trtllm-serve",
        model_path,
        "--backend",
        "pytorch",
        "--host",
        tr.bind_address,
        "--port",
        str(tr.http_port or 8000),
        "--tp_size",
        str(par.tp),
        "--pp_size",
        str(par.pp),
    ]
    if par.moe_ep is not None:
        argv += ["--ep_size", str(par.moe_ep)]
    argv += [
        "--max_batch_size",
        str(eng.max_batch_size),
        "--max_num_tokens",
        str(eng.resolved_max_num_tokens),
        "--max_seq_len",
        str(eng.max_seq_len),
        "--max_beam_width",
        str(eng.max_beam_width),
        "--kv_cache_free_gpu_memory_fraction",
        str(config.runtime.kv_cache_free_gpu_mem_fraction),
        table.serve_options_flag,
        options_file,
    ]

    if config.model.tokenizer:
        argv += ["--tokenizer", str(config.resolve_path(config.model.tokenizer))]
    return argv


def engine_equivalent(config: ForgeConfig, plan: BuildPlan) -> dict:
    """The TensorRT-engine LLM-API call that builds the same engine as the plan (for users who prefer Python)."""
    eff = plan.effective
    assert eff is not None  # engine-target plans always have one
    build_config = {
        "max_batch_size": eff.max_batch_size,
        "max_input_len": eff.max_input_len,
        "max_seq_len": config.engine.max_seq_len,
        "max_num_tokens": config.engine.resolved_max_num_tokens,
        "max_beam_width": eff.max_beam_width,
        "kv_cache_type": str(config.engine.kv_cache_type).upper(),
        "gather_context_logits": config.engine.gather_logits.context,
        "gather_generation_logits": config.engine.gather_logits.generation,
        "plugin_config": {
            **{
                k.removeprefix("--"): v
                for k, v in plan.build_flags.items()
                if k.endswith("_plugin")
                or k
                in (
                    "--context_fmha",
                    "--use_paged_context_fmha",
                    "--use_fp8_context_fmha",
                    "--remove_input_padding",
                    "--reduce_fusion",
                    "--user_buffer",
                    "--multiple_profiles",
                    "--tokens_per_block",
                    "--fuse_fp4_quant",
                )
            },
        },
    }
    kwargs: dict = {
        "model": plan.model_dir,
        "tensor_parallel_size": plan.tp,
        "pipeline_parallel_size": plan.pp,
        "dtype": plan.dtype,
        "build_config": build_config,
        "kv_cache_config": _kv_cache_config(config, pytorch=False),
    }
    if plan.quant.quant_algo or plan.quant.kv_cache_quant_algo:
        kwargs["quant_config"] = {"quant_algo": plan.quant.quant_algo, "kv_cache_quant_algo": plan.quant.kv_cache_quant_algo}
        if plan.quant.quant_algo in ("W4A16_AWQ", "W4A8_AWQ", "W4A16"):
            kwargs["quant_config"]["group_size"] = config.quantization.group_size
    if plan.quant.needs_calibration:
        calib = config.quantization.calibration
        kwargs["calib_config"] = {
            "calib_dataset": "./calibration",
            "calib_batches": calib.size,
            "calib_batch_size": 1,
            "calib_max_seq_length": calib.seq_len,
        }
    sp = config.engine.speculative
    if sp.mode == "eagle":
        assert sp.draft_model is not None  # config/checks.py requires it for this mode
        kwargs["speculative_config"] = {
            "class": "EagleDecodingConfig",
            "max_draft_len": sp.max_draft_len,
            "speculative_model": str(config.resolve_path(sp.draft_model)),
        }
    elif sp.mode == "lookahead":
        kwargs["speculative_config"] = {"class": "LookaheadDecodingConfig", "max_draft_len": sp.max_draft_len}
    lines = [
        "from tensorrt_llm._tensorrt_engine import LLM",
        "from tensorrt_llm.llmapi import BuildConfig, CalibConfig, KvCacheConfig, QuantConfig",
        "from tensorrt_llm.plugin import PluginConfig",
        "from tensorrt_llm.quantization import QuantAlgo",
        "",
        f"plugin_config = PluginConfig.from_arguments({build_config['plugin_config']!r})  # enable/disable strings as on the CLI",
        "build_config = BuildConfig("
        + ", ".join(f"{k}={v!r}" for k, v in build_config.items() if k not in ("plugin_config", "kv_cache_type"))
        + ", plugin_config=plugin_config)",
    ]
    call = [
        f"model={plan.model_dir!r}",
        f"tensor_parallel_size={plan.tp}",
        f"pipeline_parallel_size={plan.pp}",
        f"dtype={plan.dtype!r}",
        "build_config=build_config",
        "kv_cache_config=KvCacheConfig(" + ", ".join(f"{k}={v!r}" for k, v in kwargs["kv_cache_config"].items()) + ")",
    ]
    if "quant_config" in kwargs:
        q = kwargs["quant_config"]
        args = [f"quant_algo=QuantAlgo.{q['quant_algo']}" if q["quant_algo"] else "quant_algo=None"]
        if q["kv_cache_quant_algo"]:
            args.append(f"kv_cache_quant_algo=QuantAlgo.{q['kv_cache_quant_algo']}")
        if "group_size" in q:
            args.append(f"group_size={q['group_size']}")
        call.append("quant_config=QuantConfig(" + ", ".join(args) + ")")
    if "calib_config" in kwargs:
        call.append("calib_config=CalibConfig(" + ", ".join(f"{k}={v!r}" for k, v in kwargs["calib_config"].items()) + ")")
    lines += ["", "llm = LLM(" + ", ".join(call) + ")", "llm.save('engine')"]
    return {"kwargs": kwargs, "python": "\n".join(lines)}
