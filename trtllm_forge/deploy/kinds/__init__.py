"""The server kinds: every value of `deploy.server`, one line each (the first is the default). The config schema's
`deploy.server` choices, its rules in `config/checks.py`, `deploy start|status|stop`, `run` and `bench` all come
from here; see `protocol.py` for the contract and ARCHITECTURE.md "How to add a server kind".

Modules here import the config, the servers and the clients inside their functions: `config/schema.py` imports
this registry while the config package is being imported.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from trtllm_forge.deploy.kinds.protocol import Deployment, DeploymentStatus, ServerKind, Speaks
from trtllm_forge.deploy.kinds.triton import TritonKind
from trtllm_forge.deploy.kinds.trtllm_serve import KIND as TRTLLM_SERVE

if TYPE_CHECKING:
    from trtllm_forge.config.schema import ForgeConfig

KINDS: dict[str, ServerKind] = {
    kind.name: kind
    for kind in (
        TritonKind(),
        TRTLLM_SERVE,
    )
}
DEFAULT_KIND = next(iter(KINDS))

__all__ = ["DEFAULT_KIND", "KINDS", "Deployment", "DeploymentStatus", "ServerKind", "Speaks", "deployed", "kind_of", "server_status"]


def kind_of(config: ForgeConfig) -> ServerKind:
    """The kind the config's deploy.server names (the schema admits only registered names)."""
    return KINDS[config.deploy.server]


def deployed(workdir: Path) -> DeploymentStatus | None:
    """The workdir's deployment, whatever its kind, checked now: the running one, else the one recorded by the
    last kind in KINDS' order; None when no kind recorded one."""
    statuses = []
    for kind in KINDS.values():
        deployment = kind.read(Path(workdir))
        if deployment is not None:
            statuses.append(kind.status(deployment))
    running = [s for s in statuses if s.running]
    chosen = running or statuses
    return chosen[-1] if chosen else None


def server_status(workdir: Path) -> Deployment | None:
    """The workdir's deployment (any kind) with `running` checked now; None when nothing was deployed."""
    status = deployed(workdir)
    return status.deployment if status else None
