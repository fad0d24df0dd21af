"""Where a Triton deployment runs: a process group on this host (`local_runner.py`) or a container of the CPU
image (`container_runner.py`). `server.py` starts, waits for, checks and stops a deployment the same way for both
and asks the runner only what differs: what a start runs, how it is launched, whether it still runs (and is the
one this deployment started), why it ended, and how everything it started is stopped.

Which runner (`server.py`): `runner_for(config)` at a start (deploy.target: docker runs the CPU configs in a
container, `runs_here`; every other config runs here, and a GPU config's docker/Kubernetes renderings are written by
`deploy --target`, never run), `recorded_runner(deployment)` for a deployment read back from state.json.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from trtllm_forge.config.schema import ForgeConfig
    from trtllm_forge.deploy.kinds.protocol import ProcessStatus
    from trtllm_forge.deploy.state import TritonDeployment

CONTAINER_TARGET = "docker"  # the deploy.target a container runs


class PortTaken(Exception):
    """A port picked as free was taken by someone else before the server bound it (the start picks again)."""


class ServerPlan(Protocol):
    """What a start runs, computed without side effects (`deploy --dry-run` shows it)."""

    repository: Path
    models: list[str]
    ports: dict[str, int]
    log: Path

    def describe(self) -> dict[str, Any]: ...


class Runner(Protocol):
    @property
    def where(self) -> str:
        """The deploy.target it runs: "local" or "docker"."""

    def plan(self, config: ForgeConfig, workdir: Path, repository: Path | None) -> ServerPlan: ...

    def dry_run_sections(self, plan: ServerPlan, state: Path) -> list[tuple[str, list[str]]]:
        """`deploy --dry-run` for people: a heading and its lines (commands to copy, files) per section."""

    def prepare(self, plan: ServerPlan) -> None:
        """Once before the first launch: what the plan needs besides the repository (backend files, the image)."""

    def launch(self, plan: ServerPlan, workdir: Path, *, die_with_caller: bool) -> TritonDeployment:
        """Start the server (not waiting for it) and record it in state.json. PortTaken when a port was taken."""

    def exit_code(self, deployment: TritonDeployment) -> int | None:
        """The server's exit code once it ended (-1: gone without one); None while it runs or starts."""

    def port_taken(self, deployment: TritonDeployment) -> bool:
        """Whether the server that ended did so because a port it was given was taken."""

    def is_ours(self, deployment: TritonDeployment) -> bool:
        """The recorded server runs and is the one this deployment started (never a recycled pid or name)."""

    def health(self, deployment: TritonDeployment) -> list[str]:
        """What is wrong with a running server that Triton does not say (dead python stubs), now."""

    def dead_models(self, deployment: TritonDeployment) -> list[str]:
        """Models with a python stub that died (Triton keeps saying they are ready)."""

    def terminate(self, deployment: TritonDeployment, grace_s: float) -> None:
        """SIGTERM everything the deployment started, SIGKILL after the grace; nothing of it is left."""

    def leftovers(self, deployment: TritonDeployment) -> list[int]:
        """Processes a dead server left running."""

    def ended(self, deployment: TritonDeployment) -> str | None:
        """Why a deployment recorded as started no longer runs, in words (None: it runs, or nothing to say)."""

    def process(self, deployment: TritonDeployment) -> ProcessStatus:
        """The server as `deploy status` lists it."""

    def save_log(self, deployment: TritonDeployment) -> None:
        """Bring the server's output into deployment.log (a container's is kept by the runtime)."""


def in_container(config: ForgeConfig) -> bool:
    """Whether a start runs the config in a container of the CPU image: deploy.target docker and a CPU engine."""
    return config.deploy.target == CONTAINER_TARGET and config.engine.on_cpu


def runs_here(config: ForgeConfig) -> bool:
    """Whether `deploy` starts the config where deploy.target says: here, or in a container of the CPU image.
    Otherwise (Kubernetes; docker for a GPU engine) it writes the rendering only."""
    return config.deploy.target == "local" or in_container(config)
