"""`deploy --target docker|kubernetes`: render the `docker run` command or a Kubernetes manifest.

Rendered only: nothing here talks to a Docker engine or a cluster. The workdir is mounted at the same path
inside the container, so the absolute paths the rendered repository holds (engine dir, tokenizer) resolve.
The GPU image comes from the serving-image table (builders/tensorrt_llm/spec/serving-images.json): the one image
that built the engine serves it, and an engine whose TensorRT-LLM differs from the image's is refused.
The Kubernetes documents (storage, probes, multi-node LeaderWorkerSet) are built by deploy/kubernetes.py.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from trtllm_forge.builders.tensorrt_llm.images import check_engine_for_config, check_host_driver, describe_image, serving_image
from trtllm_forge.config import ForgeConfig
from trtllm_forge.containers.image import cpu_image_tag
from trtllm_forge.deploy.launch import container_leader_command

# Defined once in server_argv.py (the CPU container, docker run and Kubernetes use the same); re-exported.
from trtllm_forge.deploy.server_argv import CONTAINER_PORTS as CONTAINER_PORTS
from trtllm_forge.deploy.server_argv import CONTAINER_TRITONSERVER as CONTAINER_TRITONSERVER
from trtllm_forge.deploy.server_argv import bind_address, tritonserver_argv
from trtllm_forge.engine_config import read_engine_config
from trtllm_forge.errors import ConfigError
from trtllm_forge.stage_results import RenderResult


def image_for(config: ForgeConfig) -> str:
    """deploy.image, else the serving image of the pinned TensorRT-LLM version (multi-node: ours, with kubectl)."""
    if config.deploy.image:
        return config.deploy.image
    if config.engine.backend == "tensorrt-llm":
        return serving_image(None, config.engine.trtllm_version, multi_node=config.parallel.nodes > 1)
    # The CPU image `make image` builds (containers/image.py), by its content-hash tag, as `deploy --target docker` runs it.
    return cpu_image_tag()


def check_rendered_engine(config: ForgeConfig, workdir: Path) -> None:
    """Refuse (exit 2) to deploy the rendered repository's TensorRT-LLM engine in an image of another version."""
    rendered = RenderResult.in_workdir(workdir)
    engine_dir = rendered.engine_dir if rendered else None
    if config.engine.backend != "tensorrt-llm" or not engine_dir or not (engine_dir / "config.json").is_file():
        return
    engine = read_engine_config(engine_dir)
    if engine.backend == "tensorrt-llm":
        check_engine_for_config(config, engine.version)


def _gpus(config: ForgeConfig) -> int:
    if config.engine.backend != "tensorrt-llm":
        return config.deploy.resources.gpus or 0
    return config.deploy.resources.gpus if config.deploy.resources.gpus is not None else config.parallel.world_size


def container_command(config: ForgeConfig, workdir: Path, repository: Path) -> list[str]:
    if config.parallel.world_size > 1:
        return container_leader_command(config, repository, CONTAINER_PORTS)
    return tritonserver_argv(CONTAINER_TRITONSERVER, repository, CONTAINER_PORTS, bind_address(config, in_container=True))


def _env(config: ForgeConfig) -> dict[str, str]:
    libraries = [str(config.resolve_path(p)) for p in config.engine.plugins.custom_libraries]
    return {"LD_PRELOAD": ":".join(libraries)} if libraries and config.engine.backend == "tensorrt-llm" else {}


def _name(config: ForgeConfig) -> str:
    return "trtllm-forge-" + re.sub(r"[^a-z0-9-]+", "-", (config.name or "default").lower()).strip("-")


def docker_argv(config: ForgeConfig, workdir: Path, repository: Path) -> list[str]:
    bind = config.triton.bind_address
    argv = ["docker", "run", "--detach", "--name", _name(config), "--shm-size=1g", "--ulimit", "memlock=-1"]
    gpus = _gpus(config)
    if gpus:
        argv += ["--gpus", str(gpus)]
    if config.deploy.resources.cpus:
        argv += ["--cpus", f"{config.deploy.resources.cpus:g}"]
    if config.deploy.resources.memory_gb:
        argv += ["--memory", f"{config.deploy.resources.memory_gb:g}g"]
    for name, inside in CONTAINER_PORTS.items():
        host_port = getattr(config.triton, f"{name}_port")
        # An empty host port lets Docker pick a free one (triton.*_port: 0).
        argv += ["-p", f"{bind}:{host_port or ''}:{inside}"]
    for key, value in _env(config).items():
        argv += ["-e", f"{key}={value}"]
    argv += ["-v", f"{workdir}:{workdir}:ro", image_for(config)]
    return argv + container_command(config, workdir, repository)


def served_paths(config: ForgeConfig, workdir: Path, repository: Path) -> list[Path]:
    """Every path a Triton pod reads: the workdir, the repository and the absolute paths its config.pbtxt files
    name (engine, tokenizer, ...), the custom plugin libraries; before render, the tokenizer the render would name.
    ConfigError when a model would run this host's Python environment (the image has its own)."""
    from trtllm_forge.render.stub_env import project_env
    from trtllm_forge.render.values import IMAGE_PATH_PARAMETERS, choose_kind, tokenizer_dir_for

    paths = [workdir.resolve(), repository.resolve()]
    paths += [config.resolve_path(p) for p in config.engine.plugins.custom_libraries]
    if not any(repository.glob("*/config.pbtxt")):
        return [*paths, tokenizer_dir_for(config, workdir, choose_kind(config, None), None)]
    from trtllm_forge.containers.mounts import path_parameters

    host_env = project_env().resolve()
    for parameter in path_parameters(repository):
        if parameter.key in IMAGE_PATH_PARAMETERS:
            continue
        path = parameter.path.resolve()
        if path == host_env or host_env in path.parents:
            raise ConfigError(
                f"{parameter.config} parameter {parameter.key}",
                f"{parameter.path} is this host's Python environment ({host_env}); the container has its own",
                f"render with deploy.target: {config.deploy.target if config.deploy.target != 'local' else 'kubernetes'} "
                "(no EXECUTION_ENV_PATH), then deploy",
            )
        paths.append(path)
    return paths


def kubernetes_documents(config: ForgeConfig, workdir: Path, repository: Path) -> list[dict]:
    """PersistentVolumeClaim, Deployment and Service on one node; for parallel.nodes > 1 the launcher, its RBAC,
    a LeaderWorkerSet and a Service to the leader (deploy/kubernetes.py)."""
    from trtllm_forge.deploy import kubernetes
    from trtllm_forge.deploy.launch import container_leader_command

    name = _name(config)
    pod = kubernetes.ServerPod(
        container="tritonserver",
        image=image_for(config),
        command=[],
        gpus=_gpus(config),
        paths=served_paths(config, workdir, repository),
        env=_env(config),
        ports=dict(CONTAINER_PORTS),
        probes=kubernetes.Probes(ready="/v2/health/ready", live="/v2/health/live"),
    )
    if config.parallel.nodes <= 1 or config.engine.backend != "tensorrt-llm":
        if config.parallel.world_size > 1:
            pod.command = container_leader_command(config, repository, CONTAINER_PORTS)
        else:
            pod.command = tritonserver_argv(CONTAINER_TRITONSERVER, repository, CONTAINER_PORTS, bind_address(config, in_container=True))
        return kubernetes.single_node(config, name, pod)
    mpi_argv = container_leader_command(config, repository, CONTAINER_PORTS)
    return kubernetes.multi_node(config, name, pod, mpi_argv[2:])  # after `mpirun --allow-run-as-root`


def kubernetes_manifest(config: ForgeConfig, workdir: Path, repository: Path) -> str:
    from trtllm_forge.deploy.kubernetes import dump_all

    return dump_all(kubernetes_documents(config, workdir, repository))


def render_target(config: ForgeConfig, workdir: Path, repository: Path, target: str) -> tuple[Path, str]:
    """(file to write, its text) for the target; ConfigError when the engine cannot load in the image."""
    check_rendered_engine(config, workdir)
    image = describe_image(image_for(config))
    if target == "docker" and image is not None:
        check_host_driver(image, field="deploy.image")  # the container runs on this host's driver
    if target == "docker":
        text = (
            "#!/bin/sh\n# Rendered by trtllm-forge deploy --target docker\nexec "
            + shlex.join(docker_argv(config, workdir, repository))
            + "\n"
        )
        return workdir / "deploy" / "docker-run.sh", text
    return workdir / "deploy" / "kubernetes.yaml", kubernetes_manifest(config, workdir, repository)
