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
from trtllm_forge.deploy.discovery import TritonInstall, server_environment

CONTAINER_TRITONSERVER = "/opt/tritonserver/bin/tritonserver"
# Environment variables the script extends (prepends to) rather than replaces.
SEARCH_PATHS = ("LD_LIBRARY_PATH", "PATH")


@dataclass
class LaunchPlan:
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    world_size: int = 1

    def script(self) -> str:
        lines = ["#!/usr/bin/env bash", "# Serve the rendered model repository (written by trtllm-forge render).",
                 "# Ports can be overridden: HTTP_PORT=... GRPC_PORT=... METRICS_PORT=... ./launch.sh", "set -euo pipefail"]
        for key, value in self.env.items():
            lines.append(f"export {key}={shlex.quote(value)}${{{key}:+:${key}}}" if key in SEARCH_PATHS
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
                backend_dir: Path | None = None, install: TritonInstall | None = None,
                ports: tuple[int, int, int] | None = None) -> LaunchPlan:
    """`install` is the local server to name (None: the container's); its environment is given as additions,
    which the script prepends to the caller's search paths."""
    tr = config.triton
    http_port, grpc_port, metrics_port = ports or (tr.http_port, tr.grpc_port, tr.metrics_port)
    if config.deploy.target == "local" and install is not None:
        binary, env = str(install.binary), server_environment(install, base={})
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
