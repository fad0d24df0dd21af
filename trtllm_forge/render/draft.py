"""The draft engine model of draft-target speculative decoding (engine path, inflight_batcher_llm kind).

NVIDIA's design, which this follows (NVIDIA/TensorRT-LLM examples/draft_target_model/README.md, "Triton Inference
Server workflow", commit 567239fcd40bda119965a3a8abf43856c63c9527):
- `tensorrt_llm_draft` is a copy of the `tensorrt_llm` model config (`cp -r tensorrt_llm tensorrt_llm_draft`, name
  changed) filled with the same values except `engine_dir`: the same kv_cache_free_gpu_mem_fraction and
  max_tokens_in_paged_kv_cache, enable_kv_cache_reuse true, inflight_fused_batching, max_queue_delay_microseconds 0,
  and decoupled_mode False;
- the BLS is filled with `tensorrt_llm_draft_model_name:tensorrt_llm_draft` (and tensorrt_llm_model_name for the
  target); a request drafts when it carries `num_draft_tokens` > 0 and may ask for `use_draft_logits`;
- "--kv_cache_enable_block_reuse must be specified for this approach" (each step re-sends the whole sequence);
  "--gather_generation_logits is necessary if using generation logits" (use_draft_logits).
NVIDIA's BLS calls both engine models with `exec()` (decoupled=False) in its loop
(triton_backend/all_models/inflight_batcher_llm/tensorrt_llm_bls/1/lib/decode.py `_spec_generate` and
lib/triton_decoder.py `_draft_generate_non_streaming`, NVIDIA/TensorRT-LLM commits 4db68284ec5583177f1cf72c109a479f8733b848
and 07f3e442717f402fba3ef7b6471363747e31e3e1); ours calls the draft the same way and the target either way.

With tp x pp > 1 the MPI leader-mode ranks load both engine models, as NVIDIA's scripts/launch_triton_server.py does
for every name given in --tensorrt_llm_model_name (NVIDIA/TensorRT-LLM triton_backend/scripts/launch_triton_server.py,
commit 0a2e2c1f1268b34586393794045691b666ba28be).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from trtllm_forge.builders.tensorrt_llm.plan import DRAFT_ENGINE_DIR
from trtllm_forge.config.schema import ForgeConfig
from trtllm_forge.engine_config import ENGINE_CONFIG, EngineInfo, read_engine_config
from trtllm_forge.errors import ConfigError
from trtllm_forge.plan.draft import engine_draft_kv_settings
from trtllm_forge.stage_results import BuildResult

# The target engine's build_config.speculative_decoding_mode that accepts draft_input_ids.
DRAFT_TOKENS_MODE = "DRAFT_TOKENS_EXTERNAL"


@dataclass(frozen=True)
class DraftEngine:
    """Where the draft engine is, and its config.json when this machine has it (render may run elsewhere)."""

    directory: Path
    info: EngineInfo | None


@dataclass
class DraftValues:
    """The draft engine model: its name, engine and the values its config.pbtxt differs in from the target's."""

    name: str
    engine_dir: Path
    parameters: dict[str, str | None]
    logits_datatype_of: str  # the draft engine's logits dtype name (the target's when its config is not here)
    dtype_of: str


def drafts(config: ForgeConfig, kind: str) -> bool:
    return kind == "inflight_batcher_llm" and config.engine.speculative.mode == "draft_target"


def locate_draft_engine(workdir: Path, engine_dir: Path) -> DraftEngine:
    """The build stage's draft engine (recorded in its manifest), else `draft/engine` beside the target's `engine/`."""
    built = BuildResult.in_workdir(workdir)
    directory = built.draft_engine_dir if built and built.draft_engine_dir else Path(engine_dir).resolve().parent / DRAFT_ENGINE_DIR
    directory = directory.resolve()
    info = read_engine_config(directory) if (directory / ENGINE_CONFIG).is_file() else None
    return DraftEngine(directory, info)


def draft_refusals(config: ForgeConfig, target: EngineInfo, draft: DraftEngine) -> list[ConfigError]:
    """What the backend or NVIDIA's draft-target loop would reject, each naming the field to change."""
    spec, problems = config.engine.speculative, []
    if not config.runtime.enable_kv_cache_reuse:
        problems.append(
            ConfigError(
                "runtime.enable_kv_cache_reuse",
                "draft-target decoding re-sends the whole sequence to both engines at every step; NVIDIA requires KV-cache reuse for it",
                "set runtime.enable_kv_cache_reuse: true",
            )
        )
    if target.speculative_decoding_mode != DRAFT_TOKENS_MODE or target.max_draft_len < spec.max_draft_len:
        problems.append(
            ConfigError(
                "engine.speculative.max_draft_len",
                f"the target engine takes {target.max_draft_len} draft tokens ({target.speculative_decoding_mode}), "
                f"the config drafts {spec.max_draft_len}",
                "rebuild the engine with this config (--speculative_decoding_mode draft_tokens_external --max_draft_len N)",
            )
        )
    info = draft.info
    if info is None:
        return problems
    where = f"draft engine {draft.directory / ENGINE_CONFIG}"
    if info.backend != "tensorrt-llm" or info.version != target.version:
        problems.append(
            ConfigError(
                where, f"is {info.backend} {info.version}, the target {target.backend} {target.version}", "rebuild both engines together"
            )
        )
    if info.world_size != target.world_size:
        problems.append(
            ConfigError(where, f"was built for {info.world_size} GPUs, the target for {target.world_size}", "rebuild both engines together")
        )
    if info.max_batch_size < target.max_batch_size:
        problems.append(
            ConfigError(
                where,
                f"max_batch_size {info.max_batch_size} is below the target's {target.max_batch_size}",
                "rebuild both engines together",
            )
        )
    if not (info.paged_kv_cache and info.use_paged_context_fmha):
        problems.append(ConfigError(where, "KV-cache reuse needs a paged KV cache and paged context FMHA", "rebuild both engines together"))
    return problems


def draft_values(config: ForgeConfig, target: EngineInfo, draft: DraftEngine, target_parameters: dict[str, str | None]) -> DraftValues:
    """tensorrt_llm_draft: the target's parameters with the draft's engine and the KV settings plan sizes it with."""
    fraction, cap = engine_draft_kv_settings(config)
    parameters = {
        **target_parameters,
        "gpt_model_path": str(draft.directory),
        "kv_cache_free_gpu_mem_fraction": str(fraction),
        "max_tokens_in_paged_kv_cache": None if cap is None else str(cap),
        "lora_cache_max_adapter_size": None,  # the draft is built without LoRA
    }
    info = draft.info or target
    return DraftValues(config.triton.model_names.tensorrt_llm_draft, draft.directory, parameters, info.logits_dtype, info.dtype)


def uses_draft_logits(target: EngineInfo, draft: DraftEngine) -> bool:
    """Whether requests default to use_draft_logits: only when the target can take the draft's logits as they are,
    i.e. both engines gather generation logits and agree in vocabulary size and logits dtype."""
    info = draft.info
    return bool(
        info is not None
        and target.gather_generation_logits
        and info.gather_generation_logits
        and info.vocab_size == target.vocab_size
        and info.logits_dtype == target.logits_dtype
    )


def draft_bls_parameters(config: ForgeConfig, target: EngineInfo, draft: DraftEngine) -> dict[str, str | None]:
    """The BLS names the draft model (NVIDIA's parameter) and gets the request defaults (ours: NVIDIA's BLS drafts
    only for requests that carry num_draft_tokens; ours drafts max_draft_len tokens unless the request says otherwise)."""
    return {
        "tensorrt_llm_draft_model_name": config.triton.model_names.tensorrt_llm_draft,
        "default_num_draft_tokens": str(config.engine.speculative.max_draft_len),
        "default_use_draft_logits": "true" if uses_draft_logits(target, draft) else "false",
    }


def draft_warnings(config: ForgeConfig, draft: DraftEngine) -> list[str]:
    warnings = []
    if draft.info is None:
        warnings.append(
            f"draft engine {draft.directory} has no config.json on this machine; tensorrt_llm_draft points there with the "
            "target's limits (build the engine here, or render on the serving host)"
        )
    if config.triton.entrypoint != "bls":
        warnings.append(
            "drafting runs in the BLS (NVIDIA's draft-target design): the ensemble calls the target alone; "
            f"send requests to {config.triton.model_names.bls} (or set triton.entrypoint: bls)"
        )
    fraction, cap = engine_draft_kv_settings(config)
    if cap is None and fraction > 0.5:
        warnings.append(
            f"target and draft each take kv_cache_free_gpu_mem_fraction {fraction} of the memory free when they load, so "
            "the second gets that share of what the first left; NVIDIA's example sets 0.5 and "
            "max_tokens_in_paged_kv_cache 2560 for both (see `trtllm-forge plan`)"
        )
    if config.parallel.world_size > 1:
        warnings.append(
            "tp x pp > 1: every MPI leader-mode rank loads the target and the draft engine model; NVIDIA's draft-target "
            "README runs this case in orchestrator mode (launch_triton_server.py --multi-model), which render does not write"
        )
    return warnings
