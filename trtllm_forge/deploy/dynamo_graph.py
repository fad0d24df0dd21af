"""NVIDIA Dynamo on GPUs (deploy.server dynamo, engine.target llmapi): the DynamoGraphDeployment a Kubernetes cluster
with Dynamo's operator runs, and the same graph as a launch script for one GPU host. Both are rendered and checked
here (the tests validate the manifest against a pinned copy of the CRD's v1beta1 schema); neither is ever applied or
run by trtllm-forge.

The graph: one OpenAI frontend (`python3 -m dynamo.frontend`, its router in deploy.dynamo.router_mode) in front of
`python3 -m dynamo.trtllm` workers, each one LLM() of TensorRT-LLM's PyTorch backend over gpus_per_worker GPUs, either
aggregated (component type `worker`) or disaggregated: prefill workers (`--disaggregation-mode prefill`) hand each
prompt's KV cache to decode workers (`--disaggregation-mode decode`). Each worker's `--extra-engine-args` YAML holds the
same LLM-API arguments trtllm-serve gets (builders/tensorrt_llm/llmapi.py `llm_api_options`); disaggregated, both sides
add the one `cache_transceiver_config` (TensorRT-LLM#18388: prefill and decode must carry the same one) and prefill
turns the overlap scheduler off.

Sources (ai-dynamo 1.6.1, the PyPI wheel): the DGD templates `dynamo/profiler/templates/dgd/trtllm/{agg,disagg}.yaml`
(container `main`, image nvcr.io/nvidia/ai-dynamo/tensorrtllm-runtime, `--publish-kv-events` on the workers the KV
router reads: aggregated ones, or prefill); the worker's flags in `dynamo/trtllm/backend_args.py` (`--model`, with
`--model-path` its obsolete alias; `--kv-block-size`, default 32, is the block size the router hashes prompts in, so
it is given the engine's tokens_per_block); the frontend's in `dynamo/frontend/frontend_args.py` and
`dynamo/common/configuration/groups/router_args.py`. The CRD (nvidia.com/v1beta1; v1alpha1 is deprecated):
tests/fixtures/dynamo/SOURCE.txt. Dynamo's TensorRT-LLM image ships TensorRT-LLM 1.3 (the `[trtllm]` extra pins
1.3.0rc29), while the LLM-API argument table the engine YAML is checked against is 1.2's (trtllm_forge/llmapi_args.py).
"""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from trtllm_forge.atomic_files import write_text_atomic
from trtllm_forge.config.schema import ForgeConfig
from trtllm_forge.errors import ConfigError, ConfigErrors
from trtllm_forge.plan.workers import gpus_per_worker, worker_counts

DGD_API_VERSION = "nvidia.com/v1beta1"
DGD_KIND = "DynamoGraphDeployment"
DYNAMO_VERSION = "1.6.1"
RUNTIME_IMAGE = f"nvcr.io/nvidia/ai-dynamo/tensorrtllm-runtime:{DYNAMO_VERSION}"  # frontend and workers alike
MAIN_CONTAINER = "main"  # the container the operator merges its ports, probes and DYN_* environment into
FRONTEND_PORT = 8000  # dynamo.frontend's default --http-port, the one the operator's frontend Service targets
DGD_NAME_LIMIT = 45  # longer DGD names break the operator's derived names (dynamo#8469)
ENGINE_ARGS_MOUNT = "/etc/trtllm-forge/dynamo"  # the workers' ConfigMap of engine YAMLs, inside the pods
# A KV transfer that has not finished in this time cancels its request rather than holding both workers' blocks
# (dynamo#15152, #14856: transfers that hang); the same value on both sides, as the whole transceiver config.
KV_TRANSFER_TIMEOUT_MS = 60_000
TRANSCEIVER_BACKEND = "DEFAULT"  # TensorRT-LLM picks NIXL or UCX, whichever its build has
GRAPH_FILE = "dynamo-graph.yaml"
LAUNCH_FILE = "dynamo-launch.sh"
LOCAL_ENGINE_ARGS = "dynamo-engine-args"  # beside the launch script: one YAML per worker role


@dataclass(frozen=True)
class WorkerRole:
    """One kind of dynamo.trtllm worker: its DGD component, replicas and flags."""

    component: str  # the DGD component name, and its engine YAML's name
    type: str  # the DGD component type: worker (aggregated), prefill or decode
    replicas: int
    disaggregation_mode: str | None  # --disaggregation-mode; None: aggregated (the worker's default)
    publish_kv_events: bool  # the KV router reads this role's cache events


def worker_roles(config: ForgeConfig) -> list[WorkerRole]:
    from trtllm_forge.deploy.dynamo_local import KV_EVENTS, router_knowledge

    counts = worker_counts(config)
    kv_router = router_knowledge(config) == KV_EVENTS
    if config.deploy.dynamo.disaggregated:
        return [
            WorkerRole("prefill", "prefill", counts.prefill, "prefill", kv_router),
            WorkerRole("decode", "decode", counts.decode, "decode", False),
        ]
    return [WorkerRole("worker", "worker", counts.aggregated, None, kv_router)]


def cache_transceiver_config(config: ForgeConfig) -> dict[str, Any]:
    """The KV transfer settings both sides of a disaggregated graph carry: one prompt's whole KV fits its buffer."""
    defaults: dict[str, Any] = {
        "backend": TRANSCEIVER_BACKEND,
        "max_tokens_in_buffer": config.engine.max_seq_len,
        "kv_transfer_timeout_ms": KV_TRANSFER_TIMEOUT_MS,
    }
    return {**defaults, **config.engine.extra_llm_api_options.get("cache_transceiver_config", {})}


def engine_args(config: ForgeConfig, role: WorkerRole) -> dict[str, Any]:
    """The role's `--extra-engine-args`: the config's LLM-API arguments, plus the disaggregation settings."""
    from trtllm_forge.builders.tensorrt_llm.llmapi import llm_api_options
    from trtllm_forge.llmapi_args import describe, table_of, unknown_keys

    args = llm_api_options(config)
    if role.disaggregation_mode is not None:
        args["cache_transceiver_config"] = cache_transceiver_config(config)
    if role.disaggregation_mode == "prefill":
        args["disable_overlap_scheduler"] = True  # NVIDIA's disaggregated examples: a context-only server has no overlap
    version = table_of(config.engine.llmapi_version, "dynamo").version  # the graph is always for Dynamo's worker (1.3)
    problems = unknown_keys(args, version=version)
    if problems:
        raise ConfigError("engine.extra_llm_api_options", describe(problems[0], version), "a TorchLlmArgs field")
    return args


def served_model_name(config: ForgeConfig) -> str:
    """The model id OpenAI clients name (/v1/models)."""
    return config.model.name or config.name or "default"


def model_path(config: ForgeConfig, workdir: Path) -> str:
    """The checkpoint the workers load: the llmapi build's, or before the build the path it will record."""
    from trtllm_forge.builders.tensorrt_llm.plan import model_source
    from trtllm_forge.stage_results import BuildResult

    built = BuildResult.in_workdir(workdir)
    if built is not None and built.model_yaml is not None and built.model_yaml.is_file():
        model = (yaml.safe_load(built.model_yaml.read_text()) or {}).get("model")
        if model:
            return built.moved_here(str(model))
    return str(model_source(config, None))


def worker_argv(config: ForgeConfig, role: WorkerRole, model: str, engine_args_file: str) -> list[str]:
    par = config.parallel
    argv = [
        "python3",
        "-m",
        "dynamo.trtllm",
        "--model",
        model,
        "--served-model-name",
        served_model_name(config),
        "--extra-engine-args",
        engine_args_file,
        "--tensor-parallel-size",
        str(par.tp),
        "--pipeline-parallel-size",
        str(par.pp),
    ]
    if par.moe_ep is not None:
        argv += ["--expert-parallel-size", str(par.moe_ep)]
    argv += ["--kv-block-size", str(config.engine.tokens_per_block)]
    if role.disaggregation_mode is not None:
        argv += ["--disaggregation-mode", role.disaggregation_mode]
    if role.publish_kv_events:
        argv.append("--publish-kv-events")
    return argv


def frontend_argv(config: ForgeConfig, *, host: str | None = None, port: int = FRONTEND_PORT) -> list[str]:
    argv = ["python3", "-m", "dynamo.frontend"]
    if host is not None:
        argv += ["--http-host", host]
    from trtllm_forge.deploy.dynamo_local import router_flags

    return [*argv, "--http-port", str(port), *router_flags(config)]


def graph_name(config: ForgeConfig) -> str:
    from trtllm_forge.deploy.kubernetes import app_name

    return app_name(config, "dynamo")[:DGD_NAME_LIMIT].rstrip("-")


def _read_paths(config: ForgeConfig, model: str) -> list[Path]:
    """What the pods read besides the engine YAMLs: checkpoint, tokenizer, draft model, custom plugin libraries."""
    paths = [Path(model)]
    for value in (config.model.tokenizer, config.engine.speculative.draft_model):
        if value:
            paths.append(config.resolve_path(value))
    return paths + [config.resolve_path(p) for p in config.engine.plugins.custom_libraries]


def _environment(config: ForgeConfig) -> dict[str, str]:
    """Strings only: the operator's webhook refuses a YAML boolean (`y`, `on`) as an env value."""
    env = {"HF_HUB_OFFLINE": "1"}  # the checkpoint is mounted; nothing is downloaded
    libraries = config.engine.plugins.custom_libraries
    if libraries:
        env["LD_PRELOAD"] = ":".join(str(config.resolve_path(p)) for p in libraries)
    return env


def _pod_template(config: ForgeConfig, name: str, argv: list[str], gpus: int, paths: list[Path], engine_args: bool) -> dict[str, Any]:
    """A PodTemplateSpec with the one container `main` (deploy/kubernetes.py's pod: storage, resources, scheduling)."""
    from trtllm_forge.deploy.kubernetes import ServerPod, pod_spec

    image = config.deploy.image or RUNTIME_IMAGE
    pod = ServerPod(container=MAIN_CONTAINER, image=image, command=argv, gpus=gpus, paths=paths, env=_environment(config))
    spec = pod_spec(config, name, pod)
    # The operator mounts /dev/shm itself (the component's sharedMemorySize): a second volume there would clash.
    spec["volumes"] = [v for v in spec["volumes"] if v["name"] != "shm"]
    container = spec["containers"][0]
    container["volumeMounts"] = [m for m in container["volumeMounts"] if m["mountPath"] != "/dev/shm"]
    if engine_args:
        spec["volumes"].append({"name": "engine-args", "configMap": {"name": f"{name}-engine-args"}})
        container["volumeMounts"].append({"name": "engine-args", "mountPath": ENGINE_ARGS_MOUNT, "readOnly": True})
    return {"metadata": {"labels": _labels(name)}, "spec": spec}


def _labels(name: str) -> dict[str, str]:
    from trtllm_forge.deploy.kubernetes import labels_of

    return labels_of(name)


def graph_documents(config: ForgeConfig, model: str) -> list[dict[str, Any]]:
    """The PersistentVolumeClaim the pods read (unless given), the ConfigMap of engine YAMLs and the DGD."""
    from trtllm_forge.deploy.kubernetes import SHM_GB_GPU, gpus_per_pod, volume_claim

    refuse_problems(config)
    name = graph_name(config)
    paths = _read_paths(config, model)
    roles = worker_roles(config)
    nodes = config.parallel.nodes
    pod_gpus = gpus_per_pod(config) if nodes > 1 else gpus_per_worker(config)
    components: list[dict[str, Any]] = [
        {
            "name": "frontend",
            "type": "frontend",
            "replicas": 1,
            "podTemplate": _pod_template(config, name, frontend_argv(config), 0, paths, engine_args=False),
        }
    ]
    for role in roles:
        argv = worker_argv(config, role, model, f"{ENGINE_ARGS_MOUNT}/{role.component}.yaml")
        component: dict[str, Any] = {
            "name": role.component,
            "type": role.type,
            "replicas": role.replicas,
            "sharedMemorySize": f"{config.deploy.kubernetes.shm_gb or SHM_GB_GPU:g}Gi",
            "podTemplate": _pod_template(config, name, argv, pod_gpus, paths, engine_args=True),
        }
        if nodes > 1:
            component["multinode"] = {"nodeCount": nodes}  # the operator starts the worker's ranks over the nodes
        components.append(component)
    engine_yamls = {f"{role.component}.yaml": _engine_yaml(config, role) for role in roles}
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": f"{name}-engine-args", "labels": _labels(name)},
        "data": engine_yamls,
    }
    graph = {
        "apiVersion": DGD_API_VERSION,
        "kind": DGD_KIND,
        "metadata": {"name": name, "labels": _labels(name)},
        "spec": {"backendFramework": "trtllm", "components": components},
    }
    return [*volume_claim(config, name, paths, shared=True), config_map, graph]


def _engine_yaml(config: ForgeConfig, role: WorkerRole) -> str:
    return (
        f"# LLM-API arguments of the dynamo.trtllm {role.component} workers (--extra-engine-args), rendered by trtllm-forge.\n"
        + yaml.safe_dump(engine_args(config, role), sort_keys=False)
    )


class _GraphDumper(yaml.SafeDumper):
    """Mappings used twice written twice (no anchors); the ConfigMap's engine YAMLs as readable literal blocks."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)


_GraphDumper.add_representer(str, _str)


def render_dynamo_graph(config: ForgeConfig, workdir: Path) -> tuple[Path, str]:
    """Write <workdir>/deploy/dynamo-graph.yaml (the claim, the engine YAMLs' ConfigMap and the DGD); (path, text)."""
    text = yaml.dump_all(graph_documents(config, model_path(config, workdir)), Dumper=_GraphDumper, sort_keys=False)
    path = workdir / "deploy" / GRAPH_FILE
    write_text_atomic(path, text)
    return path, text


def host_gpus(config: ForgeConfig) -> int:
    return config.hardware.count or config.parallel.gpus_per_node


def render_dynamo_launch_script(config: ForgeConfig, workdir: Path) -> tuple[Path, str]:
    """Write <workdir>/deploy/dynamo-launch.sh (and the engine YAMLs beside it): the same graph on one GPU host, every
    worker on its own GPUs, discovery through a folder (no etcd, no NATS); (path, text). Never run by trtllm-forge."""
    refuse_problems(config)
    roles = worker_roles(config)
    per_worker = gpus_per_worker(config)
    needed = per_worker * sum(role.replicas for role in roles)
    if config.parallel.nodes > 1 or needed > host_gpus(config):
        raise ConfigError(
            "deploy.dynamo",
            f"the graph needs {needed} GPUs over {config.parallel.nodes} node(s) and one host has {host_gpus(config)} "
            "(hardware.count, else parallel.gpus_per_node)",
            "fewer workers or GPUs per worker, or render it for a cluster: deploy --target kubernetes",
        )
    out = workdir / "deploy"
    model = model_path(config, workdir)
    host, port = config.triton.bind_address, config.triton.http_port or FRONTEND_PORT
    lines = [
        "#!/bin/sh",
        f"# NVIDIA Dynamo {DYNAMO_VERSION} on one GPU host: the graph of deploy/{GRAPH_FILE}, rendered by trtllm-forge",
        f"# from config {config.name!r}. Never run by trtllm-forge (it was written where there is no GPU). Needs",
        f"# ai-dynamo[trtllm]=={DYNAMO_VERSION} (or its image {RUNTIME_IMAGE}) and {needed} GPUs.",
        "set -eu",
        "export DYN_DISCOVERY_BACKEND=file  # no etcd: workers register in a folder the frontend reads",
        f"export DYN_FILE_KV={shlex.quote(str(out / 'dynamo-discovery'))}",
        "export DYN_REQUEST_PLANE=tcp  # no NATS",
        "export HF_HUB_OFFLINE=1",
        "trap 'kill $(jobs -p) 2>/dev/null' INT TERM EXIT",
    ]
    first_gpu = 0
    for role in roles:
        engine_file = out / LOCAL_ENGINE_ARGS / f"{role.component}.yaml"
        write_text_atomic(engine_file, _engine_yaml(config, role))
        argv = worker_argv(config, role, model, str(engine_file))
        for index in range(role.replicas):
            devices = ",".join(str(gpu) for gpu in range(first_gpu, first_gpu + per_worker))
            first_gpu += per_worker
            lines.append(f"# {role.component} {index}")
            lines.append(f"CUDA_VISIBLE_DEVICES={devices} {shlex.join(argv)} &")
    lines += ["# frontend", shlex.join(frontend_argv(config, host=host, port=port)) + " &", "wait"]
    text = "\n".join(lines) + "\n"
    path = out / LAUNCH_FILE
    write_text_atomic(path, text)
    path.chmod(0o755)
    return path, text


def refuse_problems(config: ForgeConfig) -> None:
    problems = list(dynamo_config_problems(config))
    if not problems and config.deploy.dynamo.disaggregated:
        # What the workers will be given: the same cache transceiver both sides, with a transfer timeout (#18388).
        from trtllm_forge.config.nvidia_lint import disaggregated_pair

        roles = {role.disaggregation_mode: engine_args(config, role) for role in worker_roles(config)}
        problems = disaggregated_pair(roles["prefill"], roles["decode"], lambda key: f"engine.extra_llm_api_options.{key}")
    if problems:
        raise ConfigErrors(problems) if len(problems) > 1 else problems[0]


def dynamo_config_problems(config: ForgeConfig) -> Iterator[ConfigError]:
    """The config rules of Dynamo graphs (deploy.server dynamo), on GPU and CPU configs alike."""
    dynamo, eng = config.deploy.dynamo, config.engine
    world = config.parallel.world_size
    if not eng.on_cpu and eng.target != "llmapi":
        yield ConfigError(
            "engine.target",
            f"{eng.target}: Dynamo's TensorRT-LLM worker (dynamo.trtllm) serves only the PyTorch backend (the LLM API), "
            "not trtllm-build engines",
            "set engine.target: llmapi",
        )
    if eng.on_cpu and dynamo.disaggregated:
        yield ConfigError(
            "deploy.dynamo.disaggregated",
            f"disaggregated prefill and decode is rendered for GPUs only (engine.backend {eng.backend} runs aggregated)",
            "set disaggregated: false, or engine.backend: tensorrt-llm with engine.target: llmapi",
        )
    if dynamo.gpus_per_worker is not None and eng.on_cpu:
        yield ConfigError("deploy.dynamo.gpus_per_worker", f"is set but engine.backend {eng.backend} runs on the CPU", "leave it unset")
    elif dynamo.gpus_per_worker is not None and dynamo.gpus_per_worker != world:
        yield ConfigError(
            "deploy.dynamo.gpus_per_worker",
            f"{dynamo.gpus_per_worker} differs from parallel.tp x parallel.pp = {world}: each dynamo.trtllm worker is one "
            "LLM() over tp x pp GPUs (moe_ep splits the tensor-parallel GPUs, it adds none)",
            f"set gpus_per_worker: {world}, or leave it unset",
        )
    if not eng.on_cpu and dynamo.router_mode == "kv" and not config.runtime.enable_kv_cache_reuse:
        yield ConfigError(
            "deploy.dynamo.router_mode",
            "kv routes each prompt to the worker whose KV cache holds most of it, and with runtime.enable_kv_cache_reuse "
            "false TensorRT-LLM reuses (and publishes) no cached blocks",
            "set runtime.enable_kv_cache_reuse: true, or router_mode: round-robin",
        )
