"""Typed values of a model repository: engine-bound ones from the engine's config.json, the rest from our
config's `runtime` and `triton` sections. Combinations Triton or the engine would reject at load time are
refused here with the config field to change.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from trtllm_forge.config.schema import BUILTIN_MODELS, CPU_BACKENDS, ForgeConfig, TritonConfig
from trtllm_forge.engine_config import EngineInfo
from trtllm_forge.errors import ConfigError, ConfigErrors
from trtllm_forge.importer.stage import imported_checkpoint
from trtllm_forge.render.draft import DraftEngine, DraftValues, draft_bls_parameters, draft_refusals, draft_values, draft_warnings, drafts
from trtllm_forge.render.stub_env import project_env

KINDS = ("inflight_batcher_llm", "cpu", "llmapi", "vllm")
ENGINE_KINDS = ("inflight_batcher_llm", "cpu")

TRITON_DTYPES = {
    "float32": "TYPE_FP32",
    "float16": "TYPE_FP16",
    "bfloat16": "TYPE_BF16",
    "fp32": "TYPE_FP32",
    "fp16": "TYPE_FP16",
    "bf16": "TYPE_BF16",
}

# The C++ backend executes its workers from this path inside NVIDIA's Triton TRT-LLM containers.
EXECUTOR_WORKER_PATH = "/opt/tritonserver/backends/tensorrtllm/trtllmExecutorWorker"
# Parameters naming a path inside the serving image, not on the host: a container or pod mounts nothing for them.
IMAGE_PATH_PARAMETERS = ("executor_worker_path",)


def choose_kind(config: ForgeConfig, kind: str | None) -> str:
    if kind:
        if kind not in KINDS:
            raise ConfigError("--kind", f"unknown repository kind {kind!r}", f"one of {', '.join(KINDS)}")
        return kind
    if config.engine.target == "llmapi":  # on openvino: the CPU stand-in for the LLM API
        return "llmapi"
    return "cpu" if config.engine.on_cpu else "inflight_batcher_llm"


def triton_dtype(name: str, where: str) -> str:
    try:
        return TRITON_DTYPES[name.lower()]
    except KeyError:
        raise ConfigError(where, f"unsupported dtype {name!r}", f"one of {', '.join(sorted(TRITON_DTYPES))}") from None


def kv_tokens_for_one_sequence(beam_width: int, max_seq_len: int, tokens_per_block: int) -> int:
    """Smallest paged KV budget that holds one full sequence: beam × max_seq_len rounded up to blocks."""
    return beam_width * math.ceil(max_seq_len / tokens_per_block) * tokens_per_block


def pb_bool(value: bool) -> str:
    return "true" if value else "false"


@dataclass
class RepositoryValues:
    """Everything the templates need, already typed and checked."""

    kind: str
    names: dict[str, str]
    max_batch_size: int
    decoupled: bool
    bls_decoupled: bool
    max_queue_delay_microseconds: int
    max_queue_size: int
    instances: dict[str, int]
    logits_datatype: str
    encoder_input_features_data_type: str
    prompt_embedding_table_data_type: str
    tensorrt_llm_backend: str
    engine_model_description: str
    tokenizer_dir: Path
    engine_dir: Path | None
    preprocessing_parameters: dict[str, str | None] = field(default_factory=dict)
    postprocessing_parameters: dict[str, str | None] = field(default_factory=dict)
    tensorrt_llm_parameters: dict[str, str | None] = field(default_factory=dict)
    bls_parameters: dict[str, str | None] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    draft: DraftValues | None = None  # draft-target decoding's second engine model (render/draft.py)

    def template_context(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def refusals(config: ForgeConfig, engine: EngineInfo, kind: str) -> list[ConfigError]:
    """Every combination the backend would reject at load time, each naming the field to change."""
    problems: list[ConfigError] = []
    rt, eng, tr = config.runtime, config.engine, config.triton
    if rt.streaming and not tr.decoupled:
        problems.append(
            ConfigError(
                "triton.decoupled",
                "runtime.streaming is true but the models are not decoupled; Triton rejects streamed requests",
                "set triton.decoupled: true, or runtime.streaming: false",
            )
        )
    if kind == "cpu" and engine.backend not in CPU_BACKENDS:
        problems.append(
            ConfigError(
                "--engine-dir",
                f"the cpu repository kind needs an OpenVINO engine or an ONNX Runtime GenAI engine, {engine.directory} is {engine.backend!r}",
                "pass the engine built with engine.backend: openvino or onnxruntime, or --kind inflight_batcher_llm",
            )
        )
    if kind == "inflight_batcher_llm" and engine.backend != "tensorrt-llm":
        problems.append(
            ConfigError(
                "--engine-dir",
                f"inflight_batcher_llm needs a TensorRT-LLM engine, {engine.directory} is {engine.backend!r}",
                "pass a TensorRT-LLM 1.2.x engine directory, or --kind cpu for an OpenVINO engine",
            )
        )
    if eng.max_beam_width > engine.max_beam_width:
        problems.append(
            ConfigError(
                "engine.max_beam_width",
                f"{eng.max_beam_width} is above the engine's max_beam_width ({engine.max_beam_width})",
                f"use at most {engine.max_beam_width}, or rebuild the engine",
            )
        )
    if rt.decoding_mode == "beam_search" and engine.max_beam_width < 2:
        problems.append(
            ConfigError(
                "runtime.decoding_mode",
                "beam_search needs an engine built with max_beam_width > 1 (this one has 1)",
                "use auto/top_k/top_p/top_k_top_p, or rebuild with engine.max_beam_width > 1",
            )
        )
    for flag in ("enable_kv_cache_reuse", "enable_chunked_context"):
        if getattr(rt, flag) and not engine.use_paged_context_fmha:
            problems.append(
                ConfigError(
                    f"runtime.{flag}",
                    "needs an engine built with paged context FMHA (use_paged_context_fmha is off)",
                    f"set runtime.{flag}: false, or rebuild with engine.plugins.paged_context_fmha: true",
                )
            )
        if getattr(rt, flag) and not engine.paged_kv_cache:
            problems.append(
                ConfigError(
                    f"runtime.{flag}",
                    "needs a paged KV cache but the engine was built without one",
                    f"set runtime.{flag}: false, or rebuild with engine.kv_cache_type: paged",
                )
            )
    for side, built in (("context", engine.gather_context_logits), ("generation", engine.gather_generation_logits)):
        if getattr(eng.gather_logits, side) and not built:
            problems.append(
                ConfigError(
                    f"engine.gather_logits.{side}",
                    f"{side} logits are requested but the engine was built without gather_{side}_logits",
                    f"rebuild the engine with gather_{side}_logits, or set engine.gather_logits.{side}: false",
                )
            )
    if config.parallel.world_size != engine.world_size:
        problems.append(
            ConfigError(
                "parallel.tp",
                f"tp × pp = {config.parallel.tp} × {config.parallel.pp} = {config.parallel.world_size} but the engine "
                f"was built for tp {engine.tp_size} × pp {engine.pp_size} = {engine.world_size}",
                "make parallel.tp/parallel.pp match the engine, or rebuild it",
            )
        )
    needed = kv_tokens_for_one_sequence(max(eng.max_beam_width, 1), engine.max_seq_len, engine.tokens_per_block)
    if rt.max_tokens_in_paged_kv_cache is not None and rt.max_tokens_in_paged_kv_cache < needed:
        problems.append(
            ConfigError(
                "runtime.max_tokens_in_paged_kv_cache",
                f"{rt.max_tokens_in_paged_kv_cache} tokens cannot hold one full sequence (beam {max(eng.max_beam_width, 1)} × "
                f"max_seq_len {engine.max_seq_len} in blocks of {engine.tokens_per_block} = {needed})",
                f"use at least {needed}, or lower engine.max_seq_len",
            )
        )
    if eng.max_batch_size > engine.max_batch_size:
        problems.append(
            ConfigError(
                "engine.max_batch_size",
                f"{eng.max_batch_size} is above the engine's max_batch_size ({engine.max_batch_size}); the "
                "ensemble would allow more than its composing models",
                f"use at most {engine.max_batch_size}, or rebuild the engine",
            )
        )
    if eng.lora.enabled and not engine.lora_plugin:
        problems.append(
            ConfigError(
                "engine.lora.enabled",
                "LoRA is enabled but the engine was built without the LoRA plugin",
                "rebuild with engine.lora.enabled: true, or turn it off",
            )
        )
    return problems


def _choices(value: str | None) -> str | None:
    """'[[0],[0,0],[1]]' (our config) -> '{0}, {0, 0}, {1}' (the backend's choice-tree syntax)."""
    if not value:
        return None
    import json

    try:
        tree = json.loads(value)
    except json.JSONDecodeError:
        raise ConfigError("engine.speculative.choices", f"not a JSON list of lists: {value!r}", "e.g. '[[0],[0,0],[1]]'") from None
    return ", ".join("{" + ", ".join(str(int(i)) for i in path) + "}" for path in tree)


def tokenizer_dir_for(config: ForgeConfig, workdir: Path, kind: str, engine_dir: Path | None) -> Path:
    if config.model.tokenizer:
        return config.resolve_path(config.model.tokenizer).resolve()
    if kind == "cpu" and engine_dir is not None:
        return engine_dir.resolve()
    imported = imported_checkpoint(workdir)
    if imported is not None:
        return imported.resolve()
    source = config.resolve_path(config.model.source)
    if config.model.source not in BUILTIN_MODELS and source.suffix != ".gguf":
        return source  # a Hugging Face directory on the serving host (GPU examples use /models/...)
    return (workdir / "import" / "checkpoint").resolve()


def instance_counts(triton: TritonConfig, max_batch_size: int) -> dict[str, int]:
    """Instances per model role. An unset BLS count follows NVIDIA's advice for bls_instance_count (one instance
    per request the engine batches, since each serves one request at a time) when clients call the BLS, and is 1
    when they call the ensemble (tensorrtllm_backend docs/model_config.md, tensorrt_llm_bls table)."""
    counts = triton.instances.model_dump()
    if counts["bls"] is None:
        counts["bls"] = max_batch_size if triton.entrypoint == "bls" else 1
    return counts


def compute_values(config: ForgeConfig, workdir: Path, engine: EngineInfo, kind: str, draft: DraftEngine | None = None) -> RepositoryValues:
    """`draft`: the draft engine of a draft-target config (render/draft.py `locate_draft_engine`)."""
    problems = refusals(config, engine, kind)
    if not drafts(config, kind):
        draft = None  # only a draft-target engine repository has a draft model
    elif draft is None:
        raise ConfigError("engine.speculative", "draft-target decoding needs the draft engine", "this is a bug in trtllm-forge")
    else:
        problems += draft_refusals(config, engine, draft)
    if problems:
        raise ConfigErrors(problems) if len(problems) > 1 else problems[0]
    rt, tr = config.runtime, config.triton
    engine_dir = engine.directory.resolve()
    tokenizer_dir = tokenizer_dir_for(config, workdir, kind, engine_dir)
    warnings = []
    if not tokenizer_dir.is_dir():
        warnings.append(
            f"tokenizer directory {tokenizer_dir} does not exist on this machine "
            "(run import first, set model.tokenizer, or render on the serving host)"
        )
    instances = instance_counts(tr, engine.max_batch_size)
    if instances["bls"] < engine.max_batch_size and tr.entrypoint == "bls":
        warnings.append(
            f"triton.instances.bls is {instances['bls']}; each BLS instance serves requests one at a time "
            f"(like NVIDIA's BLS), so concurrent requests queue; consider {engine.max_batch_size}"
        )
    if draft is not None:
        warnings += draft_warnings(config, draft)
    names = tr.model_names.model_dump()
    python_env = str(project_env()) if config.deploy.target == "local" else None
    common_tokenizer = {
        "tokenizer_dir": str(tokenizer_dir),
        "trust_remote_code": pb_bool(config.model.trust_remote_code),
    }
    beam = max(config.engine.max_beam_width, 1)
    if kind == "cpu":
        engine_params: dict[str, str | None] = {
            "gpt_model_path": str(engine_dir),
            "max_tokens_in_paged_kv_cache": None if rt.max_tokens_in_paged_kv_cache is None else str(rt.max_tokens_in_paged_kv_cache),
            "kv_cache_free_gpu_mem_fraction": str(rt.kv_cache_free_gpu_mem_fraction),
            "enable_kv_cache_reuse": pb_bool(rt.enable_kv_cache_reuse),
            "enable_chunked_context": pb_bool(rt.enable_chunked_context),
            "batch_scheduler_policy": rt.scheduler_policy,
            "max_beam_width": str(beam),
            "exclude_input_in_output": pb_bool(rt.exclude_input_in_output),
            "max_queue_size": str(tr.max_queue_size) if tr.max_queue_size else None,
            "arrival_window_ms": None if rt.arrival_window_ms is None else str(rt.arrival_window_ms),
            "EXECUTION_ENV_PATH": python_env,
        }
        backend, description = "python", "trtllm-forge CPU engine model on OpenVINO GenAI, same tensor contract as TensorRT-LLM"
    else:
        spec = config.engine.speculative
        engine_params = {
            "max_beam_width": str(beam),
            "FORCE_CPU_ONLY_INPUT_TENSORS": "no",
            "gpt_model_type": rt.batching_strategy,
            "gpt_model_path": str(engine_dir),
            "max_tokens_in_paged_kv_cache": None if rt.max_tokens_in_paged_kv_cache is None else str(rt.max_tokens_in_paged_kv_cache),
            "batch_scheduler_policy": rt.scheduler_policy,
            "kv_cache_free_gpu_mem_fraction": str(rt.kv_cache_free_gpu_mem_fraction),
            "exclude_input_in_output": pb_bool(rt.exclude_input_in_output),
            "enable_kv_cache_reuse": pb_bool(rt.enable_kv_cache_reuse),
            "enable_chunked_context": pb_bool(rt.enable_chunked_context),
            "decoding_mode": None if rt.decoding_mode == "auto" else rt.decoding_mode,
            "num_nodes": str(config.parallel.nodes) if config.parallel.nodes > 1 else None,
            "executor_worker_path": EXECUTOR_WORKER_PATH,
            "medusa_choices": _choices(spec.choices) if spec.mode == "medusa" else None,
            "eagle_choices": _choices(spec.choices) if spec.mode == "eagle" else None,
            "lora_cache_max_adapter_size": str(config.engine.lora.max_loras) if engine.lora_plugin else None,
        }
        backend, description = "tensorrtllm", f"TensorRT-LLM {engine.version} engine, C++ backend"
    bls_draft: dict[str, str | None] = {"tensorrt_llm_draft_model_name": ""}
    draft_model = None
    if draft is not None:
        draft_model = draft_values(config, engine, draft, engine_params)
        bls_draft = draft_bls_parameters(config, engine, draft)
    return RepositoryValues(
        kind=kind,
        names=names,
        max_batch_size=engine.max_batch_size,
        decoupled=tr.decoupled,
        bls_decoupled=tr.decoupled,
        max_queue_delay_microseconds=tr.max_queue_delay_microseconds,
        max_queue_size=tr.max_queue_size,
        instances=instances,
        logits_datatype=triton_dtype(engine.logits_dtype, "engine config.json pretrained_config.logits_dtype"),
        encoder_input_features_data_type=triton_dtype(engine.dtype, "engine config.json pretrained_config.dtype"),
        # The ensemble declares prompt_embedding_table as FP16 in 1.2; the engine model must agree.
        prompt_embedding_table_data_type="TYPE_FP16",
        tensorrt_llm_backend=backend,
        engine_model_description=description,
        tokenizer_dir=tokenizer_dir,
        engine_dir=engine_dir,
        preprocessing_parameters={**common_tokenizer, "add_special_tokens": "true", "EXECUTION_ENV_PATH": python_env},
        postprocessing_parameters={**common_tokenizer, "skip_special_tokens": "true", "EXECUTION_ENV_PATH": python_env},
        tensorrt_llm_parameters=engine_params,
        bls_parameters={
            **common_tokenizer,
            "skip_special_tokens": "true",
            "accumulate_tokens": "true",
            "tensorrt_llm_model_name": names["tensorrt_llm"],
            # NVIDIA's 1.2 BLS declares both; empty means "none" to its model (no draft model, no multimodal
            # encoder). A draft-target repository names its draft model (render/draft.py); none has an encoder.
            **bls_draft,
            "multimodal_encoders_name": "",
            "preprocessing_model_name": names["preprocessing"],
            "tensorrt_llm_decoupled": pb_bool(tr.decoupled),
            "EXECUTION_ENV_PATH": python_env,
        },
        warnings=warnings,
        draft=draft_model,
    )
