"""Kubernetes documents every server kind renders with (deploy.target kubernetes): the pod of one server, its
storage, probes, `/dev/shm`, resources and scheduling, the Service, and for parallel.nodes > 1 a LeaderWorkerSet
whose leader starts every rank with `mpirun` over the group's pods.

What a pod reads (workdir, engine, tokenizer, checkpoint) is mounted read-only at the same absolute paths as on the
host that rendered it, so every path the rendered files name stays true inside the container; the image's own
Python serves the models (a path in this host's Python environment is refused). Storage is a PersistentVolumeClaim
holding those paths (each mounted by sub-path: the claim holds `models/x` for `/models/x`), or by choice
(deploy.kubernetes.storage: host_path) the node's own directories.

Multi-node follows the LeaderWorkerSet TensorRT-LLM example (kubernetes-sigs/lws@0e2e095:docs/examples/tensorrt-llm/
lws.yaml and build/server.py, adapted from triton-inference-server/tutorials@f59d968:Deployment/Kubernetes/
EKS_Multinode_Triton_TRTLLM): the leader waits until every worker pod runs, then runs `mpirun --host pod:slots,...`
(slots = GPUs per pod; without them Open MPI counts one slot per host and stops with "not enough slots") with
Open MPI's remote-shell agent set to `kubectl exec` (the tutorials' `kubessh`), so no image needs sshd; workers only
stay up for the ranks the leader starts in them. The leader's service account may get and exec into pods (the
example's rbac.yaml). Pod names come from LWS (kubernetes-sigs/lws:api/leaderworkerset/v1/leaderworkerset_types.go):
the leader is `<set>-<group>` (the first label of LWS_LEADER_ADDRESS), worker i is `<set>-<group>-<i>`, and
LWS_GROUP_SIZE counts the pods of the group.
"""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from trtllm_forge.config import ForgeConfig
from trtllm_forge.errors import ConfigError

LWS_API = "leaderworkerset.x-k8s.io/v1"
LAUNCHER_DIR = "/etc/trtllm-forge"
RSH_AGENT = f"{LAUNCHER_DIR}/kubexec"  # Open MPI's plm_rsh_agent: `kubexec POD COMMAND...`
WORKER_WAIT_POLL_S = 2
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
SHM_GB_CPU, SHM_GB_GPU = 1.0, 64.0
PROBE_PERIOD_S = 10
# A worker pod holds the ranks the leader execs into it; it only has to stay up (and stop on SIGTERM).
WORKER_COMMAND = ["/bin/sh", "-c", "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done"]

Document = dict[str, Any]


@dataclass(frozen=True)
class Probes:
    """HTTP paths of the served port: ready (readiness and startup) and live."""

    ready: str
    live: str
    port: str = "http"


@dataclass
class ServerPod:
    """One pod of a server: what it runs, what it serves, what it reads."""

    container: str
    image: str
    command: list[str]
    gpus: int
    paths: list[Path]  # absolute paths the processes read, mounted read-only at the same place
    env: dict[str, str] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)  # empty: serves nothing (an LWS worker)
    probes: Probes | None = None
    service_account: str | None = None
    launcher: bool = False  # mounts the kubectl-exec agent (the LWS leader)


def app_name(config: ForgeConfig, prefix: str) -> str:
    import re

    name = prefix + "-" + re.sub(r"[^a-z0-9-]+", "-", (config.name or "default").lower()).strip("-")
    return name[:63].rstrip("-")


def labels_of(name: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": name, "app.kubernetes.io/managed-by": "trtllm-forge"}


def mounted_paths(paths: list[Path]) -> list[Path]:
    """Absolute, resolved paths without those nested in another one (the outer mount covers them)."""
    kept: list[Path] = []
    for path in sorted({Path(p).resolve() for p in paths}, key=lambda p: len(p.parts)):
        if not any(path == outer or outer in path.parents for outer in kept):
            kept.append(path)
    return sorted(kept)


def claim_name(config: ForgeConfig, name: str) -> str:
    return config.deploy.kubernetes.volume_claim or f"{name}-data"[:63]


def _volumes(config: ForgeConfig, name: str, pod: ServerPod) -> tuple[list[Document], list[Document]]:
    """(volumes, volumeMounts): the read paths, /dev/shm and the launcher."""
    k8s = config.deploy.kubernetes
    volumes: list[Document] = []
    mounts: list[Document] = []
    paths = mounted_paths(pod.paths)
    if k8s.storage == "pvc":
        volumes.append({"name": "data", "persistentVolumeClaim": {"claimName": claim_name(config, name), "readOnly": True}})
        mounts += [{"name": "data", "mountPath": str(p), "subPath": str(p).lstrip("/"), "readOnly": True} for p in paths]
    else:
        for index, path in enumerate(paths):
            volumes.append({"name": f"host-{index}", "hostPath": {"path": str(path)}})
            mounts.append({"name": f"host-{index}", "mountPath": str(path), "readOnly": True})
    shm_gb = k8s.shm_gb or (SHM_GB_GPU if pod.gpus else SHM_GB_CPU)
    volumes.append({"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{shm_gb:g}Gi"}})
    mounts.append({"name": "shm", "mountPath": "/dev/shm"})
    if pod.launcher:
        volumes.append({"name": "launcher", "configMap": {"name": f"{name}-launcher", "defaultMode": 0o555}})
        mounts.append({"name": "launcher", "mountPath": LAUNCHER_DIR, "readOnly": True})
    return volumes, mounts


def _resources(config: ForgeConfig, gpus: int) -> Document:
    res = config.deploy.resources
    limits: dict[str, str] = {}
    requests: dict[str, str] = {}
    if res.cpus:
        requests["cpu"] = limits["cpu"] = f"{res.cpus:g}"
    if res.memory_gb:
        requests["memory"] = limits["memory"] = f"{res.memory_gb:g}Gi"
    if gpus:
        limits["nvidia.com/gpu"] = str(gpus)
    rdma = config.deploy.kubernetes.rdma
    if rdma.resource:
        limits[rdma.resource] = str(rdma.count)
    return {k: v for k, v in (("limits", limits), ("requests", requests)) if v}


def _probes(config: ForgeConfig, probes: Probes) -> Document:
    """Readiness and liveness once started; the startup probe allows deploy.ready_timeout_s for the load."""
    return {
        "startupProbe": {
            "httpGet": {"path": probes.ready, "port": probes.port},
            "periodSeconds": PROBE_PERIOD_S,
            "failureThreshold": max(1, math.ceil(config.deploy.ready_timeout_s / PROBE_PERIOD_S)),
        },
        "readinessProbe": {"httpGet": {"path": probes.ready, "port": probes.port}, "periodSeconds": 5},
        "livenessProbe": {"httpGet": {"path": probes.live, "port": probes.port}, "periodSeconds": PROBE_PERIOD_S, "failureThreshold": 3},
    }


def pod_spec(config: ForgeConfig, name: str, pod: ServerPod) -> Document:
    k8s = config.deploy.kubernetes
    volumes, mounts = _volumes(config, name, pod)
    env = {**pod.env, **k8s.nccl_env}
    container: Document = {
        "name": pod.container,
        "image": pod.image,
        "command": pod.command,
        "env": [{"name": key, "value": value} for key, value in env.items()],
        "resources": _resources(config, pod.gpus),
        "volumeMounts": mounts,
    }
    if pod.ports:
        container["ports"] = [{"name": port_name, "containerPort": port} for port_name, port in pod.ports.items()]
    if pod.probes:
        container.update(_probes(config, pod.probes))
    if k8s.rdma.resource:
        container["securityContext"] = {"capabilities": {"add": ["IPC_LOCK"]}}  # RDMA pins (locks) its buffers
    spec: Document = {"containers": [container], "volumes": volumes}
    if pod.service_account:
        spec["serviceAccountName"] = pod.service_account
    if k8s.node_selector:
        spec["nodeSelector"] = dict(k8s.node_selector)
    tolerations = (
        [t.model_dump(exclude_none=True) for t in k8s.tolerations]
        if k8s.tolerations is not None
        else ([GPU_TOLERATION] if pod.gpus else [])
    )
    if tolerations:
        spec["tolerations"] = tolerations
    return spec


def volume_claim(config: ForgeConfig, name: str, paths: list[Path], shared: bool) -> list[Document]:
    """The PersistentVolumeClaim the pods read (none when deploy.kubernetes.volume_claim names an existing one,
    or storage is host_path). `shared`: pods on several nodes read it (ReadWriteMany)."""
    k8s = config.deploy.kubernetes
    if k8s.storage != "pvc" or k8s.volume_claim:
        return []
    spec: Document = {
        "accessModes": ["ReadWriteMany" if shared else "ReadWriteOnce"],
        "resources": {"requests": {"storage": f"{k8s.storage_gb}Gi"}},
    }
    if k8s.storage_class:
        spec["storageClassName"] = k8s.storage_class
    contents = ", ".join(str(p) for p in mounted_paths(paths))
    return [
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {
                "name": claim_name(config, name),
                "labels": labels_of(name),
                # What to copy into the claim before the pods start: each path at its own path (no leading /).
                "annotations": {"trtllm-forge/contents": contents},
            },
            "spec": spec,
        }
    ]


def deployment(config: ForgeConfig, name: str, pod: ServerPod) -> Document:
    labels = labels_of(name)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": pod_spec(config, name, pod)},
        },
    }


def service(name: str, selector: dict[str, str], ports: dict[str, int]) -> Document:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "labels": labels_of(name)},
        "spec": {"selector": selector, "ports": [{"name": n, "port": p, "targetPort": n} for n, p in ports.items()]},
    }


def single_node(config: ForgeConfig, name: str, pod: ServerPod) -> list[Document]:
    """PersistentVolumeClaim (unless given), Deployment and Service of one pod."""
    return [*volume_claim(config, name, pod.paths, shared=False), deployment(config, name, pod), service(name, labels_of(name), pod.ports)]


def gpus_per_pod(config: ForgeConfig) -> int:
    """MPI ranks (= GPUs) in each pod of a multi-node group: tp x pp spread evenly over parallel.nodes."""
    nodes, world = config.parallel.nodes, config.parallel.world_size
    if world % nodes or world // nodes > config.parallel.gpus_per_node:
        raise ConfigError(
            "parallel.nodes",
            f"tp x pp = {world} ranks cannot be spread evenly over {nodes} nodes of {config.parallel.gpus_per_node} GPUs",
            "nodes must divide tp x pp, with tp x pp / nodes <= gpus_per_node",
        )
    return world // nodes


def rsh_agent_script(container: str) -> str:
    """Open MPI starts its daemon on each worker pod with `kubexec POD COMMAND...` through the Kubernetes API."""
    return (
        "#!/bin/sh\n"
        "# Open MPI's remote-shell agent (plm_rsh_agent): run the command in the pod through the Kubernetes API,\n"
        "# so no image needs sshd. Written by trtllm-forge.\n"
        'pod="$1"\nshift\n'
        f'exec kubectl exec "$pod" -c {shlex.quote(container)} -- /bin/sh -c "$*"\n'
    )


def leader_script(slots: int, timeout_s: float, mpi_args: list[str]) -> str:
    """The LWS leader's shell: the group's pods as `pod:slots`, leader first (rank 0, the one the Service reaches,
    runs there); a wait until every worker pod runs; then `mpirun` with the kubectl-exec agent."""
    return (
        'leader="${LWS_LEADER_ADDRESS%%.*}"\n'
        f'hosts="$leader:{slots}"\n'
        f"deadline=$(( $(date +%s) + {math.ceil(timeout_s)} ))\n"
        "i=1\n"
        'while [ "$i" -lt "$LWS_GROUP_SIZE" ]; do\n'
        '  until [ "$(kubectl get pod "$leader-$i" -o "jsonpath={.status.phase}" 2>/dev/null)" = Running ]; do\n'
        '    if [ "$(date +%s)" -ge "$deadline" ]; then echo "worker pod $leader-$i is not running" >&2; exit 1; fi\n'
        f"    sleep {WORKER_WAIT_POLL_S}\n"
        "  done\n"
        f'  hosts="$hosts,$leader-$i:{slots}"\n'
        "  i=$((i+1))\n"
        "done\n"
        f'exec mpirun --allow-run-as-root --mca plm_rsh_agent {RSH_AGENT} --host "$hosts" {shlex.join(mpi_args)}\n'
    )


def launcher_rbac(name: str, container: str) -> list[Document]:
    """ConfigMap with the kubectl-exec agent, and (unless deploy.kubernetes.service_account) the leader's service
    account with a Role to wait for the worker pods and exec into them."""
    labels = labels_of(name)
    launcher = f"{name}-launcher"
    return [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": launcher, "labels": labels},
            "data": {Path(RSH_AGENT).name: rsh_agent_script(container)},
        },
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": launcher, "labels": labels}},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": launcher, "labels": labels},
            "rules": [
                {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
                {"apiGroups": [""], "resources": ["pods/exec"], "verbs": ["create"]},
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": launcher, "labels": labels},
            "subjects": [{"kind": "ServiceAccount", "name": launcher}],
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": launcher},
        },
    ]


def multi_node(config: ForgeConfig, name: str, leader: ServerPod, mpi_args: list[str]) -> list[Document]:
    """PersistentVolumeClaim (ReadWriteMany, unless given), the launcher and its RBAC, the LeaderWorkerSet of
    parallel.nodes pods and the Service to the leader. `leader` serves; `mpi_args` follow `mpirun --host ...`."""
    slots = gpus_per_pod(config)
    own_account = config.deploy.kubernetes.service_account is None
    documents = launcher_rbac(name, leader.container)
    if not own_account:
        documents = documents[:1]  # the ConfigMap; the given account must allow the same
    leader.command = ["/bin/sh", "-c", leader_script(slots, config.deploy.ready_timeout_s, mpi_args)]
    leader.gpus = slots
    leader.launcher = True
    leader.service_account = config.deploy.kubernetes.service_account or f"{name}-launcher"
    worker = ServerPod(
        container=leader.container, image=leader.image, command=list(WORKER_COMMAND), gpus=slots, paths=leader.paths, env=leader.env
    )
    labels = labels_of(name)
    leader_labels = {**labels, "trtllm-forge/role": "leader"}
    lws = {
        "apiVersion": LWS_API,
        "kind": "LeaderWorkerSet",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "replicas": 1,
            "leaderWorkerTemplate": {
                "size": config.parallel.nodes,
                # Any pod restarting restarts the whole group: MPI cannot take a rank back.
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": {"metadata": {"labels": leader_labels}, "spec": pod_spec(config, name, leader)},
                "workerTemplate": {
                    "metadata": {"labels": {**labels, "trtllm-forge/role": "worker"}},
                    "spec": pod_spec(config, name, worker),
                },
            },
        },
    }
    return [*volume_claim(config, name, leader.paths, shared=True), *documents, lws, service(name, leader_labels, leader.ports)]


class _PlainDumper(yaml.SafeDumper):
    """Writes a mapping used twice (the labels) twice, not as a YAML anchor and alias."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def dump_all(documents: list[Document]) -> str:
    return yaml.dump_all(documents, Dumper=_PlainDumper, sort_keys=False)
