"""The command that serves a rendered repository, as argv (never a shell string), plus a launch script.

One rank: `tritonserver ...`. World size > 1: MPI leader mode, one rank per GPU in one MPMD `mpirun`
command; only rank 0 serves requests, the other ranks load just the engine model, and every rank gets
its own python-backend shared-memory prefix so their stubs do not collide.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path

from trtllm_forge.config.schema import ForgeConfig

CONTAINER_TRITONSERVER = "/opt/tritonserver/bin/tritonserver"


@dataclass(frozen=True)
class LocalTriton:
    """The Triton server carried by the nvidia-pytriton wheel (see cpu-stack.md)."""

    tritonserver: Path
    library_dir: Path
    python_backend_dir: Path
    stub: Path

    @property
    def env(self) -> dict[str, str]:
        return {"LD_LIBRARY_PATH": str(self.library_dir)}


def find_local_triton() -> LocalTriton | None:
    import importlib.util
    import sys

    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        return None
    package = Path(spec.submodule_search_locations[0])
    server = package / "tritonserver"
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    found = LocalTriton(
        tritonserver=server / "bin" / "tritonserver",
        library_dir=package.parent / "nvidia_pytriton.libs",
        python_backend_dir=server / "backends" / "python",
        stub=server / "python_backend_stubs" / version / "triton_python_backend_stub",
    )
    return found if found.tritonserver.is_file() and found.stub.is_file() else None


def make_backend_dir(local: LocalTriton, target: Path) -> Path:
    """A --backend-directory holding python/ with the backend library, its utils and the stub for this Python."""
    python_dir = target / "python"
    python_dir.mkdir(parents=True, exist_ok=True)
    for source in (local.python_backend_dir / "libtriton_python.so",
                   local.python_backend_dir / "triton_python_backend_utils.py", local.stub):
        link = python_dir / source.name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(source)
    return target


@dataclass
class LaunchPlan:
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    world_size: int = 1

    def script(self) -> str:
        lines = ["#!/usr/bin/env bash", "# Serve the rendered model repository (written by trtllm-forge render).",
                 "# Ports can be overridden: HTTP_PORT=... GRPC_PORT=... METRICS_PORT=... ./launch.sh", "set -euo pipefail"]
        for key, value in self.env.items():
            lines.append(f"export {key}={shlex.quote(value)}${{{key}:+:${key}}}" if key == "LD_LIBRARY_PATH"
                         else f"export {key}={shlex.quote(value)}")
        # One line per MPI rank (split at ":"), port flags overridable from the environment.
        ranks: list[list[str]] = [[]]
        for arg in self.argv:
            if arg == ":":
                ranks.append([":"])
                continue
            quoted = shlex.quote(arg)
            for flag, var in (("--http-port=", "HTTP_PORT"), ("--grpc-port=", "GRPC_PORT"), ("--metrics-port=", "METRICS_PORT")):
                if arg.startswith(flag):
                    quoted = f'{flag}"${{{var}:-{arg[len(flag):]}}}"'
            ranks[-1].append(quoted)
        lines.append("exec " + " \\\n  ".join(" ".join(rank) for rank in ranks))
        return "\n".join(lines) + "\n"


def server_args(config: ForgeConfig, repository: Path, rank: int, engine_model: str | None,
                http_port: int, grpc_port: int, metrics_port: int) -> list[str]:
    tr = config.triton
    # Inside a container the server must listen beyond loopback to be reachable through the published ports.
    address = tr.bind_address if config.deploy.target == "local" else "0.0.0.0"
    args = [
        f"--model-repository={repository}",
        f"--http-port={http_port}",
        f"--grpc-port={grpc_port}",
        f"--metrics-port={metrics_port}",
        f"--http-address={address}",
        f"--grpc-address={address}",
        # Our configs are complete; auto-complete could only change them behind our back.
        "--disable-auto-complete-config",
        f"--backend-config=python,shm-region-prefix-name=prefix{rank}_",
    ]
    if rank != 0 and engine_model:
        args += ["--model-control-mode=explicit", f"--load-model={engine_model}"]
    return args


def plan_launch(config: ForgeConfig, repository: Path, *, world_size: int = 1, engine_model: str | None = None,
                backend_dir: Path | None = None, local: LocalTriton | None = None,
                ports: tuple[int, int, int] | None = None) -> LaunchPlan:
    tr = config.triton
    http_port, grpc_port, metrics_port = ports or (tr.http_port, tr.grpc_port, tr.metrics_port)
    if config.deploy.target == "local" and local is not None:
        binary, env = str(local.tritonserver), local.env
    else:
        binary, env = CONTAINER_TRITONSERVER, {}
    extra = [f"--backend-directory={backend_dir}"] if backend_dir is not None else []
    if world_size <= 1:
        return LaunchPlan([binary, *server_args(config, repository, 0, engine_model, http_port, grpc_port, metrics_port), *extra], env, 1)
    argv = ["mpirun", "--allow-run-as-root"]
    for rank in range(world_size):
        if rank:
            argv.append(":")
        argv += ["-n", "1", binary, *server_args(config, repository, rank, engine_model, http_port, grpc_port, metrics_port), *extra]
    return LaunchPlan(argv, env, world_size)
