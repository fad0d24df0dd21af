"""NVIDIA's own LLM-API validators, and what breaks deployments that pass them, as lint before any GPU time.

Each rule is a pure function over the LLM API's arguments (the dict `LLM()` / `trtllm-serve --config` / model.yaml
receive), so the same rule checks a config (`config validate`: the arguments the config makes, see `config_options`)
and a rendered file (`lint_options`). A rule's docstring names NVIDIA's source: a validator of
NVIDIA/TensorRT-LLM `tensorrt_llm/llmapi/llm_args.py` (the stored version the index holds without its commit, the
one whose `CacheTransceiverConfig` has `transceiver_runtime` and `kv_transfer_timeout_ms`; field names also at
commit 0004396720054fd8e205cbf616f21f0b57c6b412) or the issue where the failure was reported.

`where` maps an argument's dotted name to the config field that set it, so every problem names a line of the file.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from trtllm_forge.errors import ConfigError

if TYPE_CHECKING:
    from trtllm_forge.config.checks import CheckContext
    from trtllm_forge.config.schema import ForgeConfig

LLM_ARGS = "NVIDIA/TensorRT-LLM tensorrt_llm/llmapi/llm_args.py"
EXTRA = "engine.extra_llm_api_options"
DEVICE_MEMORY_UNIT = 1024**3  # hardware.json's memory_gb is GiB (plan/memory.py reads it the same way)

# The LLM-API argument each config field becomes (builders/tensorrt_llm/llmapi.py llm_api_options writes them;
# tests/test_nvidia_lint.py checks the two agree on every example config).
CONFIG_FIELD_OF = {
    "max_batch_size": "engine.max_batch_size",
    "max_num_tokens": "engine.max_num_tokens",
    "max_seq_len": "engine.max_seq_len",
    "enable_chunked_prefill": "runtime.enable_chunked_context",
    "kv_cache_config.free_gpu_memory_fraction": "runtime.kv_cache_free_gpu_mem_fraction",
    "tensor_parallel_size": "parallel.tp",
    "pipeline_parallel_size": "parallel.pp",
    "moe_expert_parallel_size": "parallel.moe_ep",
    "moe_tensor_parallel_size": "parallel.moe_tp",
}

Where = Callable[[str], str]
Lint = Callable[[Mapping[str, Any], Where], Iterator[ConfigError]]


def _get(options: Mapping[str, Any], dotted: str) -> Any:
    value: Any = options
    for part in dotted.split("."):
        if not isinstance(value, Mapping):
            return None
        value = value.get(part)
    return value


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def cuda_graph_batch_sizes(options: Mapping[str, Any], where: Where) -> Iterator[ConfigError]:
    """CUDA-graph batch sizes unique, at least 1 and at most `max_batch_size`; `cuda_graph_config.max_batch_size`,
    when set beside `batch_sizes`, equal to their maximum (llm_args.py `CudaGraphConfig.validate_cuda_graph_config`).
    Sizes above `max_batch_size`, with duplicates, are what AIConfigurator 0.12 wrote and what broke serving
    (SemiAnalysisAI/InferenceX#2596): graphs are captured for batches the scheduler never forms."""
    graphs = options.get("cuda_graph_config")
    if not isinstance(graphs, Mapping):
        return
    max_batch = _int(options.get("max_batch_size"))
    sizes = graphs.get("batch_sizes")
    field = where("cuda_graph_config.batch_sizes")
    if isinstance(sizes, list) and sizes:
        numbers = [s for s in sizes if _int(s) is not None]
        repeated = sorted(size for size, count in Counter(numbers).items() if count > 1)
        if repeated:
            yield ConfigError(field, f"lists {', '.join(map(str, repeated))} more than once (InferenceX#2596)", "each batch size once")
        if any(s < 1 for s in numbers):
            yield ConfigError(field, "holds a batch size below 1", "batch sizes >= 1")
        if max_batch is not None and any(s > max_batch for s in numbers):
            above = sorted({s for s in numbers if s > max_batch})
            yield ConfigError(
                field,
                f"{', '.join(map(str, above))} above max_batch_size {max_batch}: graphs for batches the scheduler never "
                "forms (InferenceX#2596)",
                f"batch sizes <= {max_batch}, or raise max_batch_size ({where('max_batch_size')})",
            )
        declared = _int(graphs.get("max_batch_size")) or 0
        if numbers and declared and declared != max(numbers):
            yield ConfigError(
                where("cuda_graph_config.max_batch_size"),
                f"{declared} differs from max(batch_sizes) {max(numbers)} ({LLM_ARGS} CudaGraphConfig.validate_cuda_graph_config)",
                "leave it unset (0) or set it to max(batch_sizes)",
            )
        return
    declared = _int(graphs.get("max_batch_size")) or 0
    if max_batch is not None and declared > max_batch:
        yield ConfigError(
            where("cuda_graph_config.max_batch_size"),
            f"{declared} is above max_batch_size {max_batch}: graphs for batches the scheduler never forms (InferenceX#2596)",
            f"at most {max_batch}",
        )


def tokens_per_step_hold_a_prompt(options: Mapping[str, Any], where: Where) -> Iterator[ConfigError]:
    """Without chunked prefill a prompt is prefilled in one step, so `max_num_tokens` (tokens per step) must hold
    the longest sequence, `max_seq_len`; with chunked prefill a long prompt is split across steps (TorchLlmArgs
    `max_num_tokens`, `max_seq_len`, `enable_chunked_prefill` in llm_args.py)."""
    tokens, seq = _int(options.get("max_num_tokens")), _int(options.get("max_seq_len"))
    if tokens is None or seq is None or options.get("enable_chunked_prefill"):
        return
    if tokens < seq:
        yield ConfigError(
            where("max_num_tokens"),
            f"{tokens} tokens per step cannot prefill a prompt of up to max_seq_len {seq} tokens without chunked prefill",
            f"max_num_tokens >= {seq}, or enable chunked prefill ({where('enable_chunked_prefill')}: true)",
        )


def kv_fraction_and_bytes(options: Mapping[str, Any], where: Where, device_bytes: float | None = None) -> Iterator[ConfigError]:
    """`kv_cache_config.free_gpu_memory_fraction` in (0, 1]; `max_gpu_total_bytes` >= 0 and, when both are set, the
    smaller wins (llm_args.py `KvCacheConfig` field descriptions; TensorRT-LLM#2773): a byte cap above the GPU's memory
    never binds, so the fraction alone decides."""
    fraction = _get(options, "kv_cache_config.free_gpu_memory_fraction")
    if isinstance(fraction, (int, float)) and not isinstance(fraction, bool) and not 0 < fraction <= 1:
        yield ConfigError(where("kv_cache_config.free_gpu_memory_fraction"), f"{fraction} is outside (0, 1]", "a share such as 0.9")
    cap = _get(options, "kv_cache_config.max_gpu_total_bytes")
    if cap is None:
        return
    cap_bytes = _int(cap)
    if cap_bytes is None or cap_bytes < 0:
        yield ConfigError(where("kv_cache_config.max_gpu_total_bytes"), f"{cap!r} is not a byte count", "an integer >= 0 (0 = no cap)")
    elif device_bytes is not None and cap_bytes > device_bytes:
        yield ConfigError(
            where("kv_cache_config.max_gpu_total_bytes"),
            f"{cap_bytes} bytes is more than the GPU's {int(device_bytes)}: the cap never binds (the smaller of it and "
            "free_gpu_memory_fraction wins, TensorRT-LLM#2773)",
            f"at most {int(device_bytes)}, or drop it",
        )


def parallel_sizes(options: Mapping[str, Any], where: Where) -> Iterator[ConfigError]:
    """MoE expert x tensor parallelism inside the tensor-parallel group: moe_expert_parallel_size x
    moe_tensor_parallel_size = tensor_parallel_size when both are set (NVIDIA/TensorRT-LLM tensorrt_llm/mapping.py
    `Mapping`, which TorchLlmArgs' parallel_config builds)."""
    tp = _int(options.get("tensor_parallel_size")) or 1
    ep, moe_tp = _int(options.get("moe_expert_parallel_size")), _int(options.get("moe_tensor_parallel_size"))
    if ep and moe_tp and ep * moe_tp != tp:
        yield ConfigError(
            where("moe_expert_parallel_size"),
            f"moe_expert_parallel_size {ep} x moe_tensor_parallel_size {moe_tp} is not tensor_parallel_size {tp}",
            "choose the two so their product is tensor_parallel_size",
        )


LINTS: dict[str, Lint] = {
    "cuda_graph_batch_sizes": cuda_graph_batch_sizes,
    "tokens_per_step_hold_a_prompt": tokens_per_step_hold_a_prompt,
    "kv_fraction_and_bytes": kv_fraction_and_bytes,
    "parallel_sizes": parallel_sizes,
}


def lint_options(options: Mapping[str, Any], where: Where | None = None, device_bytes: float | None = None) -> list[ConfigError]:
    """Every problem of one set of LLM-API arguments (a rendered model.yaml or extra-options file)."""
    name = where or (lambda key: key)
    problems = [p for lint in LINTS.values() if lint is not kv_fraction_and_bytes for p in lint(options, name)]
    return problems + list(kv_fraction_and_bytes(options, name, device_bytes))


# --- disaggregated prefill/decode (NVIDIA Dynamo) ----------------------------------------------------------------


def transceiver_timeout_set(options: Mapping[str, Any], where: Where) -> Iterator[ConfigError]:
    """A disaggregated worker needs `cache_transceiver_config` with `kv_transfer_timeout_ms`: without it a KV
    transfer that never completes holds the request and its blocks forever (TensorRT-LLM#15152, #14856;
    `CacheTransceiverConfig.kv_transfer_timeout_ms` in llm_args.py)."""
    transceiver = options.get("cache_transceiver_config")
    if not isinstance(transceiver, Mapping):
        yield ConfigError(
            where("cache_transceiver_config"),
            "disaggregated prefill/decode needs cache_transceiver_config (the KV transfer between the workers)",
            "e.g. cache_transceiver_config: {backend: DEFAULT, kv_transfer_timeout_ms: 60000}",
        )
    elif transceiver.get("kv_transfer_timeout_ms") is None:
        yield ConfigError(
            where("cache_transceiver_config.kv_transfer_timeout_ms"),
            "unset: a KV transfer that never completes holds its request forever (TensorRT-LLM#15152, #14856)",
            "a timeout in milliseconds, e.g. 60000",
        )


def disaggregated_pair(prefill: Mapping[str, Any], decode: Mapping[str, Any], where: Where | None = None) -> list[ConfigError]:
    """Rendered prefill and decode arguments: identical `cache_transceiver_config` (a prefill and a decode worker
    with different transceivers fail to exchange KV, TensorRT-LLM#18388), each with a transfer timeout."""
    name = where or (lambda key: key)
    problems = [*transceiver_timeout_set(prefill, lambda key: f"prefill.{name(key)}")]
    problems += transceiver_timeout_set(decode, lambda key: f"decode.{name(key)}")
    if prefill.get("cache_transceiver_config") != decode.get("cache_transceiver_config"):
        problems.append(
            ConfigError(
                name("cache_transceiver_config"),
                f"prefill has {prefill.get('cache_transceiver_config')!r} but decode has {decode.get('cache_transceiver_config')!r} "
                "(TensorRT-LLM#18388)",
                "the same cache_transceiver_config on both",
            )
        )
    return problems


# --- the config's arguments ----------------------------------------------------------------------------------------


def config_options(config: ForgeConfig) -> dict[str, Any]:
    """The LLM-API arguments the lint reads, as the config makes them: its fields, then extra_llm_api_options over
    them (the merge builders/tensorrt_llm/llmapi.py does)."""
    eng, par = config.engine, config.parallel
    base: dict[str, Any] = {
        "max_batch_size": eng.max_batch_size,
        "max_num_tokens": eng.resolved_max_num_tokens,
        "max_seq_len": eng.max_seq_len,
        "enable_chunked_prefill": config.runtime.enable_chunked_context,
        "kv_cache_config": {"free_gpu_memory_fraction": config.runtime.kv_cache_free_gpu_mem_fraction},
        "tensor_parallel_size": par.tp,
        "pipeline_parallel_size": par.pp,
    }
    if par.moe_ep is not None:
        base["moe_expert_parallel_size"] = par.moe_ep
    if par.moe_tp is not None:
        base["moe_tensor_parallel_size"] = par.moe_tp
    return _merge(base, eng.extra_llm_api_options)


def _merge(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in extra.items():
        merged[key] = _merge(merged[key], value) if isinstance(value, Mapping) and isinstance(merged.get(key), dict) else value
    return merged


def config_where(config: ForgeConfig) -> Where:
    """The config field an argument came from: extra_llm_api_options when it sets it, else the field it is made of."""
    extra = config.engine.extra_llm_api_options

    def where(key: str) -> str:
        if _get(extra, key) is not None or key not in CONFIG_FIELD_OF:
            return f"{EXTRA}.{key}"
        return CONFIG_FIELD_OF[key]

    return where


def _applies(ctx: CheckContext) -> bool:
    """The LLM API's arguments are used: TensorRT-LLM's PyTorch backend (engine.target llmapi) on a GPU."""
    return ctx.is_trtllm and ctx.config.engine.target == "llmapi"


def nvidia_llm_api_lint(ctx: CheckContext) -> Iterator[ConfigError]:
    """NVIDIA's LLM-API validators and the known deployment breakers (LINTS), over the config's arguments."""
    if not _applies(ctx):
        return
    device_bytes = ctx.device.memory_gb * DEVICE_MEMORY_UNIT if ctx.device else None
    yield from lint_options(config_options(ctx.config), config_where(ctx.config), device_bytes)
