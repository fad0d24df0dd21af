"""`deploy --target docker|kubernetes`: render the `docker run` command or a Kubernetes manifest.

Rendered only: nothing here talks to a Docker engine or a cluster. The workdir is mounted at the same path
inside the container, so the absolute paths the rendered repository holds (engine dir, tokenizer) resolve.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import yaml

from trtllm_forge.config import ForgeConfig
from trtllm_forge.deploy.launch import rendered_leader_command

CONTAINER_PORTS = {"http": 8000, "grpc": 8001, "metrics": 8002}
# TensorRT-LLM 1.2.1 ships in the 25.12 Triton TRT-LLM container (tensorrtllm_backend pins it there).
DEFAULT_GPU_IMAGE = "nvcr.io/nvidia/tritonserver:25.12-trtllm-python-py3"
# The CPU engine needs openvino-genai inside the image; docker/ holds the recipe for one.
DEFAULT_CPU_IMAGE = "trtllm-forge-cpu:latest"


def image_for(config: ForgeConfig) -> str:
    if config.deploy.image:
        return config.deploy.image
    return DEFAULT_GPU_IMAGE if config.engine.backend == "tensorrt-llm" else DEFAULT_CPU_IMAGE


def _gpus(config: ForgeConfig) -> int:
    if config.engine.backend != "tensorrt-llm":
        return config.deploy.resources.gpus or 0
    return config.deploy.resources.gpus if config.deploy.resources.gpus is not None else config.parallel.world_size


def container_command(config: ForgeConfig, workdir: Path, repository: Path) -> list[str]:
    if config.parallel.world_size > 1:
        return rendered_leader_command(workdir, config.parallel.world_size)
    return [
        "tritonserver",
        f"--model-repository={repository}",
        "--model-control-mode=none",
        "--disable-auto-complete-config",
        *(f"--{name}-port={port}" for name, port in CONTAINER_PORTS.items()),
    ]


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


def kubernetes_manifest(config: ForgeConfig, workdir: Path, repository: Path) -> str:
    name = _name(config)
    resources: dict[str, dict[str, str]] = {"limits": {}, "requests": {}}
    if config.deploy.resources.cpus:
        resources["requests"]["cpu"] = resources["limits"]["cpu"] = f"{config.deploy.resources.cpus:g}"
    if config.deploy.resources.memory_gb:
        resources["requests"]["memory"] = resources["limits"]["memory"] = f"{config.deploy.resources.memory_gb:g}Gi"
    if _gpus(config):
        resources["limits"]["nvidia.com/gpu"] = str(_gpus(config))
    container = {
        "name": "tritonserver",
        "image": image_for(config),
        "command": container_command(config, workdir, repository),
        "ports": [{"name": n, "containerPort": p} for n, p in CONTAINER_PORTS.items()],
        "env": [{"name": k, "value": v} for k, v in _env(config).items()],
        "resources": {k: v for k, v in resources.items() if v},
        "readinessProbe": {"httpGet": {"path": "/v2/health/ready", "port": "http"}, "periodSeconds": 5},
        "livenessProbe": {"httpGet": {"path": "/v2/health/live", "port": "http"}, "periodSeconds": 10},
        "startupProbe": {
            "httpGet": {"path": "/v2/health/ready", "port": "http"},
            "periodSeconds": 10,
            "failureThreshold": max(1, int(config.deploy.ready_timeout_s // 10)),
        },
        "volumeMounts": [{"name": "workdir", "mountPath": str(workdir), "readOnly": True}, {"name": "shm", "mountPath": "/dev/shm"}],
    }
    labels = {"app.kubernetes.io/name": name, "app.kubernetes.io/managed-by": "trtllm-forge"}
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "containers": [container],
                    "volumes": [
                        # Single-node: the workdir as a host path. Use a PersistentVolumeClaim on a real cluster.
                        {"name": "workdir", "hostPath": {"path": str(workdir), "type": "Directory"}},
                        {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}},
                    ],
                },
            },
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "labels": labels},
        "spec": {"selector": labels, "ports": [{"name": n, "port": p, "targetPort": n} for n, p in CONTAINER_PORTS.items()]},
    }
    return yaml.safe_dump_all([deployment, service], sort_keys=False)


def render_target(config: ForgeConfig, workdir: Path, repository: Path, target: str) -> tuple[Path, str]:
    """(file to write, its text) for the target."""
    if target == "docker":
        text = "#!/bin/sh\n# Rendered by trtllm-forge deploy --target docker\nexec " + shlex.join(docker_argv(config, workdir, repository)) + "\n"
        return workdir / "deploy" / "docker-run.sh", text
    return workdir / "deploy" / "kubernetes.yaml", kubernetes_manifest(config, workdir, repository)
