"""The LLM API's argument fields (TensorRT-LLM 1.2.x, PyTorch backend) and the check of model.yaml /
extra LLM-API options against them: an unknown key is refused with the nearest valid one, before any GPU time.

Names only, from NVIDIA's sources (types and defaults live in NVIDIA's pydantic models); where each table comes
from and how sure it is, per table, is in SOURCES. No file tied to a 1.2.x tag is stored where we can read
NVIDIA's files (checked 2026-12-02): `tensorrt_llm/llmapi/llm_args.py` of NVIDIA/TensorRT-LLM is stored at
fcd3f316 (0.2x era), at 00043967 (2026 main, 1.3+), and in a 1.1-era version without its commit; the versioned
API reference pages stored are 0.18.2, 0.19.0, 0.21.0rc1, 1.1.0rc2.post1, 1.3.0rc7, 1.3.0rc17, 1.3.0rc24 and
1.4.0rc4, none of 1.2.x (`tensorrt_llm/version.py` says 1.2.0rc2 at b35ac1b6, where llm_args.py is not stored).
So every table is marked uncertain and checked by bracketing: a field in both the 1.1-era file and the 1.3.0rc7
reference is taken as a 1.2.x field; one that appears only in the later source is kept and accepted, but listed
in AFTER_1_1 (its presence in 1.2.x is uncertain: accepting it can miss an error LLM() would raise, refusing it
could block a valid config).
What was searched for the v1.2.1 / v1.3.0rc29 files and which commits the releases are built from (not stored):
tests/fixtures/nvidia_llm_args/SOURCE.
`model.yaml` of NVIDIA's Triton llmapi model passes every top-level key except `triton_config` to `LLM()`
(NVIDIA/TensorRT-LLM:triton_backend/all_models/llmapi/tensorrt_llm/1/model.py).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

REPOSITORY = "NVIDIA/TensorRT-LLM"
LLM_ARGS = "tensorrt_llm/llmapi/llm_args.py"
REFERENCE_1_3 = "https://nvidia.github.io/TensorRT-LLM/1.3.0rc7/llm-api/reference.html"


@dataclass(frozen=True)
class Source:
    """Where a table was copied from or checked against: repository (or page), ref (tag, commit or version), path."""

    repository: str
    ref: str
    path: str
    what: str


@dataclass(frozen=True)
class TableProvenance:
    sources: tuple[Source, ...]
    uncertain: bool
    note: str


_ERA_1_1 = Source(REPOSITORY, "1.1-era version (commit not recorded by the index)", LLM_ARGS, "TorchLlmArgs fields, read in full")
_REF_1_3 = Source(REFERENCE_1_3, "1.3.0rc7", "llm-api/reference.html", "LLM parameters (BaseLlmArgs + TorchLlmArgs) and KvCacheConfig")
_EARLIER = Source(REPOSITORY, "1.2-era version used by the first table (commit not recorded)", LLM_ARGS, "the table's origin")
_NESTED = Source(
    "/work/shared/reference/trtllm-build.md", "§10.1 (copied from recent main)", LLM_ARGS, "nested config field lists (origin)"
)
SOURCES: dict[str, TableProvenance] = {
    "top_level": TableProvenance(
        (_EARLIER, _ERA_1_1, _REF_1_3),
        True,
        "bracketed between the 1.1-era file and the 1.3.0rc7 reference; fields only in the later source are in AFTER_1_1",
    ),
    "kv_cache_config": TableProvenance(
        (_NESTED, _REF_1_3),
        True,
        "equal to 1.3.0rc7's KvCacheConfig except its use_kv_cache_manager_v2 and max_util_for_resume (not taken: not seen before 1.3)",
    ),
    "scheduler_config": TableProvenance((_NESTED,), True, "not checked against a versioned source"),
    "quant_config": TableProvenance((_NESTED,), True, "not checked against a versioned source"),
    "speculative_config": TableProvenance(
        (_NESTED,), True, "the union of the decoding configs' fields; not checked against a versioned source"
    ),
}
SOURCE = f"{REPOSITORY}:{LLM_ARGS} (no 1.2.x-tagged copy stored; bracketed by a 1.1-era copy and the 1.3.0rc7 reference)"

BASE_LLM_ARGS = (
    "model",
    "tokenizer",
    "tokenizer_mode",
    "custom_tokenizer",
    "skip_tokenizer_init",
    "trust_remote_code",
    "tensor_parallel_size",
    "dtype",
    "revision",
    "tokenizer_revision",
    "model_kwargs",
    "pipeline_parallel_size",
    "context_parallel_size",
    "gpus_per_node",
    "moe_cluster_parallel_size",
    "moe_tensor_parallel_size",
    "moe_expert_parallel_size",
    "enable_attention_dp",
    "enable_lm_head_tp_in_adp",
    "pp_partition",
    "cp_config",
    "load_format",
    "enable_lora",
    "lora_config",
    "kv_cache_config",
    "enable_chunked_prefill",
    "guided_decoding_backend",
    "batched_logits_processor",
    "iter_stats_max_iterations",
    "request_stats_max_iterations",
    "peft_cache_config",
    "scheduler_config",
    "cache_transceiver_config",
    "sparse_attention_config",
    "speculative_config",
    "max_batch_size",
    "max_input_len",
    "max_seq_len",
    "max_beam_width",
    "max_num_tokens",
    "gather_generation_logits",
    "num_postprocess_workers",
    "postprocess_tokenizer_dir",
    "reasoning_parser",
    "decoding_config",
    "_mpi_session",
    "otlp_traces_endpoint",
    "backend",
    "return_perf_metrics",
    "perf_metrics_max_requests",
    "orchestrator_type",
    "env_overrides",
)
TORCH_LLM_ARGS = (
    "garbage_collection_gen0_threshold",
    "cuda_graph_config",
    "attention_dp_config",
    "disable_overlap_scheduler",
    "moe_config",
    "attn_backend",
    "sampler_type",
    "enable_iter_perf_stats",
    "enable_iter_req_stats",
    "print_iter_log",
    "batch_wait_timeout_ms",
    "batch_wait_timeout_iters",
    "batch_wait_max_tokens_ratio",
    "torch_compile_config",
    "enable_autotuner",
    "enable_layerwise_nvtx_marker",
    "enable_min_latency",
    "stream_interval",
    "force_dynamic_quantization",
    "allreduce_strategy",
    "checkpoint_loader",
    "checkpoint_format",
    "kv_connector_config",
    "mm_encoder_only",
    "ray_worker_extension_cls",
    # quant_config is a property of TorchLlmArgs (settable); the engine path (TrtLlmArgs) has it as a field.
    "quant_config",
    "build_config",  # the 1.1-era TorchLlmArgs keeps it as a deprecated dummy; not in the 1.3.0rc7 reference
)
# In the 1.3.0rc7 reference but not in the 1.1-era TorchLlmArgs: whether 1.2.x has them is uncertain (accepted).
AFTER_1_1 = frozenset(
    (
        "nvfp4_gemm_config",
        "sampler_force_async_worker",
        "ray_placement_config",
        "enable_sleep",
        "use_cute_dsl_blockscaling_mm",
        "use_cute_dsl_blockscaling_bmm",
        "disable_flashinfer_sampling",
        "max_stats_len",
        "layer_wise_benchmarks_config",
        "ray_worker_nsight_options",
    )
)
TOP_LEVEL = frozenset(BASE_LLM_ARGS + TORCH_LLM_ARGS) | AFTER_1_1

# Nested configs whose keys are checked too (others are passed through unchecked).
NESTED: dict[str, frozenset[str]] = {
    "kv_cache_config": frozenset(
        (
            "enable_block_reuse",
            "max_tokens",
            "max_attention_window",
            "sink_token_length",
            "free_gpu_memory_fraction",
            "host_cache_size",
            "onboard_blocks",
            "cross_kv_cache_fraction",
            "secondary_offload_min_priority",
            "event_buffer_max_size",
            "attention_dp_events_gather_period_ms",
            "enable_partial_reuse",
            "copy_on_partial_reuse",
            "use_uvm",
            "max_gpu_total_bytes",
            "dtype",
            "mamba_ssm_cache_dtype",
            "tokens_per_block",
        )
    ),
    "scheduler_config": frozenset(("capacity_scheduler_policy", "context_chunking_policy", "dynamic_batch_config", "waiting_queue_policy")),
    "quant_config": frozenset(
        (
            "quant_algo",
            "kv_cache_quant_algo",
            "group_size",
            "smoothquant_val",
            "clamp_val",
            "use_meta_recipe",
            "has_zero_point",
            "pre_quant_scale",
            "exclude_modules",
        )
    ),
    "speculative_config": frozenset(
        (
            "decoding_type",
            "max_draft_len",
            "max_total_draft_tokens",
            "speculative_model",
            "speculative_model_dir",
            "max_concurrency",
            "draft_len_schedule",
            "load_format",
            "num_extra_kv_tokens",
            "eagle_choices",
            "greedy_sampling",
            "posterior_threshold",
            "use_dynamic_tree",
            "dynamic_tree_max_topK",
            "num_eagle_layers",
            "max_non_leaves_per_layer",
            "eagle3_one_model",
            "eagle3_layers_to_capture",
            "max_matching_ngram_size",
            "is_keep_all",
            "is_use_oldest",
            "is_public_pool",
            "num_nextn_predict_layers",
            "use_relaxed_acceptance_for_thinking",
            "relaxed_topk",
            "relaxed_delta",
            "use_mtp_vanilla",
            "medusa_choices",
            "num_medusa_heads",
            "max_window_size",
            "max_ngram_size",
            "max_verification_set_size",
        )
    ),
}
# Keys of model.yaml that are not LLM() arguments (NVIDIA's Triton llmapi model reads them itself).
MODEL_YAML_ONLY = frozenset(("triton_config", "logits_post_processors"))


# --- the two supported LLM-API versions -------------------------------------------------------------------------
# 1.2.1: the Triton `llmapi` model of the NGC Triton images that ship 1.2.1; 1.3.0rc29: trtllm-serve and Dynamo's
# TensorRT-LLM runtime. Neither tag's llm_args.py is stored where we can read NVIDIA's files (see the module
# docstring); the 1.3.0rc29 table adds what the 1.3.0rc7 reference lists and 1.2 does not have, and drops what it no
# longer lists. tests/test_llmapi_versions.py checks the speculative and scheduler tables against the newest stored
# NVIDIA source (tests/fixtures/nvidia_llm_args/, repo@commit:path in its header).
V1_2_1 = "1.2.1"
V1_3 = "1.3.0rc29"
LLMAPI_VERSIONS = (V1_2_1, V1_3)
# deploy.server → the LLM-API version its runtime ships; a server kind not listed gets V1_3.
DEFAULT_VERSION_BY_SERVER = {"triton": V1_2_1}
ONLY_1_2 = frozenset(("build_config",))  # the 1.1-era TorchLlmArgs' deprecated dummy; not in the 1.3.0rc7 reference
KV_CACHE_1_3 = frozenset(("use_kv_cache_manager_v2", "max_util_for_resume"))  # 1.3.0rc7 reference, not seen before 1.3
CUDA_GRAPH = frozenset(("batch_sizes", "max_batch_size", "enable_padding"))
CACHE_TRANSCEIVER_1_2 = frozenset(("backend", "max_tokens_in_buffer"))
CACHE_TRANSCEIVER_1_3 = CACHE_TRANSCEIVER_1_2 | {"kv_transfer_timeout_ms"}  # TensorRT-LLM#15152, #14856


@dataclass(frozen=True)
class VersionTable:
    """What one LLM-API version accepts and how forge spells it for that version."""

    version: str
    top_level: frozenset[str]
    nested: dict[str, frozenset[str]]
    decoding_types: dict[str, str]  # engine.speculative.mode → decoding_type
    draft_model_key: str  # the speculative_config key naming the draft checkpoint
    serve_options_flag: str  # trtllm-serve's flag for the extra LLM-API options file
    serve_revision_flag: str  # trtllm-serve's flag for a Hugging Face revision (TensorRT-LLM#12105)
    serve_deprecated_flags: frozenset[str]  # never written (TensorRT-LLM#12106)


TABLES: dict[str, VersionTable] = {
    V1_2_1: VersionTable(
        V1_2_1,
        TOP_LEVEL,
        {**NESTED, "cuda_graph_config": CUDA_GRAPH, "cache_transceiver_config": CACHE_TRANSCEIVER_1_2},
        {"eagle": "Eagle", "draft_target": "Draft_Target", "prompt_lookup": "NGram"},
        "speculative_model_dir",
        "--extra_llm_api_options",
        "--revision",
        frozenset(),
    ),
    V1_3: VersionTable(
        V1_3,
        TOP_LEVEL - ONLY_1_2,
        {
            **NESTED,
            "kv_cache_config": NESTED["kv_cache_config"] | KV_CACHE_1_3,
            "cuda_graph_config": CUDA_GRAPH,
            "cache_transceiver_config": CACHE_TRANSCEIVER_1_3,
        },
        {"eagle": "Eagle3", "draft_target": "Draft_Target", "prompt_lookup": "NGram"},
        "speculative_model",
        "--config",
        "--hf_revision",
        frozenset(("--cluster_size", "--metrics-log-interval", "--fail_fast_on_attention_window_too_large")),
    ),
}


def version_for_server(server: str) -> str:
    return DEFAULT_VERSION_BY_SERVER.get(server, V1_3)


def table_of(engine_llmapi_version: str | None, server: str) -> VersionTable:
    """The table of engine.llmapi_version, or of the deploy.server's default version when it is unset."""
    return TABLES[engine_llmapi_version or version_for_server(server)]


def nearest(key: str, valid: Iterable[str]) -> str | None:
    match = difflib.get_close_matches(key, sorted(valid), n=1, cutoff=0.6)
    return match[0] if match else None


@dataclass(frozen=True)
class UnknownKey:
    key: str  # dotted
    near: str | None  # the nearest valid key of this version, dotted
    other_version: str | None  # another supported version that has the key


def _has(table: VersionTable, dotted: str) -> bool:
    head, _, sub = dotted.partition(".")
    if not sub:
        return head in table.top_level
    return head in table.top_level and (head not in table.nested or sub in table.nested[head])


def unknown_keys(args: Mapping, *, model_yaml: bool = False, version: str = V1_2_1) -> list[UnknownKey]:
    """Every key the LLM API of `version` would refuse (its models forbid extra fields), with the nearest valid key
    and the other supported version that has it."""
    table = TABLES[version]
    allowed = table.top_level | MODEL_YAML_ONLY if model_yaml else table.top_level
    others = [other for other in TABLES.values() if other.version != version]

    def other_with(dotted: str) -> str | None:
        return next((other.version for other in others if _has(other, dotted)), None)

    problems: list[UnknownKey] = []
    for key, value in args.items():
        if key not in allowed:
            problems.append(UnknownKey(key, nearest(key, allowed), other_with(key)))
        elif key in table.nested and isinstance(value, Mapping):
            valid = table.nested[key]
            for sub in value:
                if sub not in valid:
                    near = nearest(sub, valid)
                    problems.append(UnknownKey(f"{key}.{sub}", f"{key}.{near}" if near else None, other_with(f"{key}.{sub}")))
    return problems


def describe(problem: UnknownKey, version: str = V1_2_1) -> str:
    hint = f"did you mean {problem.near}?" if problem.near else "see the LLM API reference"
    elsewhere = f" ({problem.other_version} has it: set engine.llmapi_version: {problem.other_version})" if problem.other_version else ""
    return f"{problem.key} is not an LLM API argument of TensorRT-LLM {version} (TorchLlmArgs){elsewhere}; {hint}"
