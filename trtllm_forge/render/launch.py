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
from trtllm_forge.deploy.server_argv import PORT_NAMES, bind_address, tritonserver_argv

CONTAINER_TRITONSERVER = "/opt/tritonserver/bin/tritonserver"
# Environment variables the script extends (prepends to) rather than replaces.
SEARCH_PATHS = ("LD_LIBRARY_PATH", "PATH")


@dataclass
class LaunchPlan:
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    world_size: int = 1

    def script(self) -> str:
        lines = [
            "#!/usr/bin/env bash",
            "# Serve the rendered model repository (written by trtllm-forge render).",
            "# Ports can be overridden: HTTP_PORT=... GRPC_PORT=... METRICS_PORT=... ./launch.sh",
            "set -euo pipefail",
        ]
        for key, value in self.env.items():
            lines.append(
                f"export {key}={shlex.quote(value)}${{{key}:+:${key}}}" if key in SEARCH_PATHS else f"export {key}={shlex.quote(value)}"
            )
        # One line per MPI rank (split at ":"), port flags overridable from the environment.
        ranks: list[list[str]] = [[]]
        for arg in self.argv:
            if arg == ":":
                ranks.append([":"])
                continue
            quoted = shlex.quote(arg)
            for flag, var in (("--http-port=", "HTTP_PORT"), ("--grpc-port=", "GRPC_PORT"), ("--metrics-port=", "METRICS_PORT")):
                if arg.startswith(flag):
                    quoted = f'{flag}"${{{var}:-{arg[len(flag) :]}}}"'
            ranks[-1].append(quoted)
        lines.append("exec " + " \\\n  ".join(" ".join(rank) for rank in ranks))
        return "\n".join(lines) + "\n"


def plan_launch(
    config: ForgeConfig,
    repository: Path,
    *,
    world_size: int = 1,
    engine_models: tuple[str, ...] = (),
    backend_dir: Path | None = None,
    install: TritonInstall | None = None,
    ports: tuple[int, int, int] | None = None,
) -> LaunchPlan:
    """`install` is the local server to name (None: the container's); its environment is given as additions,
    which the script prepends to the caller's search paths."""
    tr = config.triton
    port_map = dict(zip(PORT_NAMES, ports or (tr.http_port, tr.grpc_port, tr.metrics_port), strict=False))
    local = config.deploy.target == "local"
    if local and install is not None:
        binary, env = str(install.binary), server_environment(install, base={})
    else:
        binary, env = CONTAINER_TRITONSERVER, {}
    address = bind_address(config, in_container=not local)

    def rank_argv(rank: int) -> list[str]:
        return tritonserver_argv(binary, repository, port_map, address, backend_dir=backend_dir, rank=rank, engine_models=engine_models)

    if world_size <= 1:
        return LaunchPlan(rank_argv(0), env, 1)
    argv = ["mpirun", "--allow-run-as-root"]
    for rank in range(world_size):
        if rank:
            argv.append(":")
        argv += ["-n", "1", *rank_argv(rank)]
    return LaunchPlan(argv, env, world_size)
