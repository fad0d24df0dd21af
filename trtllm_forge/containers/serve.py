"""The container that serves a rendered repository: the image's `tritonserver` with the flags every other start
uses (deploy/server_argv.py), the repository and every path its models read mounted read-only (mounts.py).

Two network modes. Published ports (the default, what the docker rendering writes): the server listens on
0.0.0.0:8000/8001/8002 inside the container and the host's ports are published on `host_address`. Host network:
the server binds `host_address` on the host's ports itself (no bridge, no NAT rules).
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from trtllm_forge.containers.mounts import repository_mounts
from trtllm_forge.containers.run import DEPLOYMENT_LABEL, RUN_LABEL, ContainerSpec
from trtllm_forge.deploy.server_argv import (
    CONTAINER_BIND_ADDRESS,
    CONTAINER_PORTS,
    CONTAINER_TRITONSERVER,  # on PATH in the CPU image (containers/image_setup.py)
    PORT_NAMES,
    tritonserver_argv,
)


def container_name(workdir: Path) -> str:
    """One container per workdir: its name says whose it is (the folder's name and a hash of its whole path, so
    two workdirs of the same name never share one)."""
    resolved = workdir.resolve()
    stem = re.sub(r"[^a-z0-9-]+", "-", resolved.name.lower()).strip("-") or "default"
    return f"trtllm-forge-{stem}-{hashlib.sha256(str(resolved).encode()).hexdigest()[:8]}"


def serving_spec(
    image: str,
    repository: Path,
    workdir: Path,
    host_ports: dict[str, int],
    *,
    host_address: str = "127.0.0.1",
    network_host: bool = False,
    run_id: str | None = None,
) -> ContainerSpec:
    """The container serving `repository` on `host_ports` (http/grpc/metrics) of `host_address`, labelled with
    the workdir it serves and `run_id` (which start it is)."""
    repository = repository.resolve()
    if network_host:
        command = tritonserver_argv(CONTAINER_TRITONSERVER, repository, host_ports, host_address)
        published: dict[int, int] = {}
    else:
        command = tritonserver_argv(CONTAINER_TRITONSERVER, repository, CONTAINER_PORTS, CONTAINER_BIND_ADDRESS)
        published = {host_ports[name]: CONTAINER_PORTS[name] for name in PORT_NAMES}
    return ContainerSpec(
        name=container_name(workdir),
        image=image,
        command=command,
        mounts=repository_mounts(repository),
        labels={DEPLOYMENT_LABEL: str(workdir.resolve()), **({RUN_LABEL: run_id} if run_id else {})},
        network_host=network_host,
        published=published,
        publish_address=host_address,
    )
