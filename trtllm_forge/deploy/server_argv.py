"""The tritonserver command line, built once for every way trtllm-forge starts a server: the local deploy
(deploy/launch.py), the rendered launch.sh and MPI leader-mode command (render/launch.py), the docker and
Kubernetes renderings (deploy/targets.py) and the benchmark's own servers (scripts/bench_support/local_triton.py).

They all get the same flags; what differs between them is a parameter: the binary, the repository path, the
ports, the address the server binds, a backend directory (wheel installs only) and the MPI rank.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from trtllm_forge.config import ForgeConfig

PORT_NAMES = ("http", "grpc", "metrics")
# Triton's own default is 30 s; deploy stop's grace period is longer so a SIGTERM can finish cleanly.
EXIT_TIMEOUT_S = 10
# Inside a container the server must listen beyond loopback to be reachable through the published ports.
CONTAINER_BIND_ADDRESS = "0.0.0.0"
# Inside every container (the CPU image, the GPU serving images, docker run and Kubernetes): Triton's default ports
# and the server on PATH.
CONTAINER_PORTS = {"http": 8000, "grpc": 8001, "metrics": 8002}
CONTAINER_TRITONSERVER = "tritonserver"


def bind_address(config: ForgeConfig, in_container: bool) -> str:
    """The address the server listens on: triton.bind_address on this host (unset: every interface)."""
    return CONTAINER_BIND_ADDRESS if in_container else (config.triton.bind_address or "0.0.0.0")


def tritonserver_argv(
    binary: Path | str,
    repository: Path | str,
    ports: Mapping[str, int | str],
    address: str,
    *,
    backend_dir: Path | str | None = None,
    rank: int = 0,
    engine_models: Sequence[str] = (),
) -> list[str]:
    """The binary and its flags. `rank` > 0 with `engine_models`: an MPI leader-mode rank that loads only the
    engine models (the target, and the draft of draft-target decoding) and serves no requests (NVIDIA's
    scripts/launch_triton_server.py does the same, one --load-model per --tensorrt_llm_model_name)."""
    argv = [str(binary), f"--model-repository={repository}"]
    if rank and engine_models:
        argv += ["--model-control-mode=explicit", *(f"--load-model={name}" for name in engine_models)]
    else:
        argv.append("--model-control-mode=none")
    argv += [
        # Our configs are complete; auto-complete could only change them behind our back.
        "--disable-auto-complete-config",
        *(f"--{name}-port={ports[name]}" for name in PORT_NAMES),
        *(f"--{name}-address={address}" for name in PORT_NAMES),
        # Every rank's python stubs get their own shared-memory prefix so they do not collide.
        f"--backend-config=python,shm-region-prefix-name=prefix{rank}_",
        f"--exit-timeout-secs={EXIT_TIMEOUT_S}",
    ]
    if backend_dir is not None:
        argv.append(f"--backend-directory={backend_dir}")
    return argv
