"""`deploy --target docker|kubernetes`: render the `docker run` command or a Kubernetes manifest.

Rendered only: nothing here talks to a Docker engine or a cluster. The workdir is mounted at the same path
inside the container, so the absolute paths the rendered repository holds (engine dir, tokenizer) resolve.
The GPU image comes from the serving-image table (builders/tensorrt_llm/spec/serving-images.json): the one image
that built the engine serves it, and an engine whose TensorRT-LLM differs from the image's is refused.
Multi-node (parallel.nodes > 1) renders a LeaderWorkerSet (a CRD: the LWS controller must be installed).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import yaml

from trtllm_forge.builders.tensorrt_llm.images import check_engine_for_config, check_host_driver, describe_image, serving_image
from trtllm_forge.config import ForgeConfig
from trtllm_forge.deploy.launch import rendered_leader_command

# Defined once in server_argv.py (the CPU container, docker run and Kubernetes use the same); re-exported.
from trtllm_forge.deploy.server_argv import CONTAINER_PORTS as CONTAINER_PORTS
from trtllm_forge.deploy.server_argv import CONTAINER_TRITONSERVER as CONTAINER_TRITONSERVER
from trtllm_forge.deploy.server_argv import bind_address, tritonserver_argv
from trtllm_forge.engine_config import read_engine_config
from trtllm_forge.errors import ConfigError
from trtllm_forge.stage_results import RenderResult

# The CPU configs' image in renderings (Kubernetes); `deploy --target docker` runs the one containers/image.py builds.
DEFAULT_CPU_IMAGE = "trtllm-forge-cpu:latest"
LWS_API = "leaderworkerset.x-k8s.io/v1"


def image_for(config: ForgeConfig) -> str:
    """deploy.image, else the serving image of the pinned TensorRT-LLM version (the one that builds the engine)."""
    if config.deploy.image:
        return config.deploy.image
    if config.engine.backend == "tensorrt-llm":
        return serving_image(None, config.engine.trtllm_version)
    return DEFAULT_CPU_IMAGE


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
        return rendered_leader_command(workdir, config.parallel.world_size)
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


def _labels(config: ForgeConfig) -> dict[str, str]:
    return {"app.kubernetes.io/name": _name(config), "app.kubernetes.io/managed-by": "trtllm-forge"}


def _resources(config: ForgeConfig, gpus: int) -> dict:
    resources: dict[str, dict[str, str]] = {"limits": {}, "requests": {}}
    if config.deploy.resources.cpus:
        resources["requests"]["cpu"] = resources["limits"]["cpu"] = f"{config.deploy.resources.cpus:g}"
    if config.deploy.resources.memory_gb:
        resources["requests"]["memory"] = resources["limits"]["memory"] = f"{config.deploy.resources.memory_gb:g}Gi"
    if gpus:
        resources["limits"]["nvidia.com/gpu"] = str(gpus)
    return {k: v for k, v in resources.items() if v}


def _pod_spec(config: ForgeConfig, workdir: Path, command: list[str], gpus: int, serving: bool) -> dict:
    container = {
        "name": "tritonserver",
        "image": image_for(config),
        "command": command,
        "env": [{"name": k, "value": v} for k, v in _env(config).items()],
        "resources": _resources(config, gpus),
        "volumeMounts": [{"name": "workdir", "mountPath": str(workdir), "readOnly": True}, {"name": "shm", "mountPath": "/dev/shm"}],
    }
    if serving:
        container["ports"] = [{"name": n, "containerPort": p} for n, p in CONTAINER_PORTS.items()]
        container["readinessProbe"] = {"httpGet": {"path": "/v2/health/ready", "port": "http"}, "periodSeconds": 5}
        container["livenessProbe"] = {"httpGet": {"path": "/v2/health/live", "port": "http"}, "periodSeconds": 10}
        container["startupProbe"] = {
            "httpGet": {"path": "/v2/health/ready", "port": "http"},
            "periodSeconds": 10,
            "failureThreshold": max(1, int(config.deploy.ready_timeout_s // 10)),
        }
    return {
        "containers": [container],
        "volumes": [
            # Single-node: the workdir as a host path. Use a PersistentVolumeClaim on a real cluster.
            {"name": "workdir", "hostPath": {"path": str(workdir), "type": "Directory"}},
            {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}},
        ],
    }


def _service(config: ForgeConfig, selector: dict[str, str]) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": _name(config), "labels": _labels(config)},
        "spec": {"selector": selector, "ports": [{"name": n, "port": p, "targetPort": n} for n, p in CONTAINER_PORTS.items()]},
    }


def gpus_per_pod(config: ForgeConfig) -> int:
    nodes, world = config.parallel.nodes, config.parallel.world_size
    if world % nodes or world // nodes > config.parallel.gpus_per_node:
        raise ConfigError(
            "parallel.nodes",
            f"tp x pp = {world} ranks cannot be spread evenly over {nodes} nodes of {config.parallel.gpus_per_node} GPUs",
            "nodes must divide tp x pp, with tp x pp / nodes <= gpus_per_node",
        )
    return world // nodes


def leader_script(launch: list[str]) -> str:
    """The LWS leader's shell: mpirun over the group's pods, addressed by the names LWS gives them
    (leader `<set>-<group>.<set>.<ns>` in LWS_LEADER_ADDRESS, worker i `<set>-<group>-<i>.<set>.<ns>`)."""
    if launch[:2] != ["mpirun", "--allow-run-as-root"]:
        raise ConfigError(
            "parallel.nodes",
            "multi-node serving needs the MPI leader-mode launch command from `trtllm-forge render`",
            "render with tp x pp > 1 first",
        )
    return (
        'hosts="$LWS_LEADER_ADDRESS"; i=1; '
        'while [ "$i" -lt "$LWS_GROUP_SIZE" ]; do hosts="$hosts,${LWS_LEADER_ADDRESS%%.*}-$i.${LWS_LEADER_ADDRESS#*.}"; i=$((i+1)); done; '
        'exec mpirun --allow-run-as-root -H "$hosts" ' + shlex.join(launch[2:])
    )


def kubernetes_documents(config: ForgeConfig, workdir: Path, repository: Path) -> list[dict]:
    """Deployment + Service on one node; LeaderWorkerSet + Service (to the leader) when parallel.nodes > 1."""
    labels = _labels(config)
    if config.parallel.nodes <= 1 or config.engine.backend != "tensorrt-llm":
        deployment = {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": _name(config), "labels": labels},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": _pod_spec(config, workdir, container_command(config, workdir, repository), _gpus(config), True),
                },
            },
        }
        return [deployment, _service(config, labels)]
    gpus = gpus_per_pod(config)
    launch = rendered_leader_command(workdir, config.parallel.world_size)
    leader_labels = {**labels, "trtllm-forge/role": "leader"}
    # Workers only host MPI ranks started by the leader's mpirun (over ssh): the image must run sshd with keys
    # shared by the group, which the NGC images do not set up on their own.
    lws = {
        "apiVersion": LWS_API,
        "kind": "LeaderWorkerSet",
        "metadata": {"name": _name(config), "labels": labels},
        "spec": {
            "replicas": 1,
            "leaderWorkerTemplate": {
                "size": config.parallel.nodes,
                "leaderTemplate": {
                    "metadata": {"labels": leader_labels},
                    "spec": _pod_spec(config, workdir, ["/bin/sh", "-c", leader_script(launch)], gpus, True),
                },
                "workerTemplate": {
                    "metadata": {"labels": {**labels, "trtllm-forge/role": "worker"}},
                    "spec": _pod_spec(config, workdir, ["/usr/sbin/sshd", "-D"], gpus, False),
                },
            },
        },
    }
    return [lws, _service(config, leader_labels)]


def kubernetes_manifest(config: ForgeConfig, workdir: Path, repository: Path) -> str:
    return yaml.safe_dump_all(kubernetes_documents(config, workdir, repository), sort_keys=False)


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
