"""The server kinds, loaded from their entries in `trtllm_forge/server_kinds.py` `SERVER_KINDS` (one line each; the
first is the default). `deploy start|status|stop`, `run` and `bench` ask them; see `protocol.py` for the contract and
ARCHITECTURE.md "How to add … a server kind".

Modules here import the config, the servers and the clients inside their functions, so that loading a kind stays
cheap (`deploy status` reads every kind's record).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING

from trtllm_forge.deploy.kinds.protocol import Deployment, DeploymentStatus, ServerKind, Speaks
from trtllm_forge.server_kinds import DEFAULT_SERVER_KIND, SERVER_KINDS, ServerKindEntry

if TYPE_CHECKING:
    from trtllm_forge.config.schema import ForgeConfig


def _load(entry: ServerKindEntry) -> ServerKind:
    module_name, _, attribute = entry.implementation.partition(":")
    kind: ServerKind = getattr(importlib.import_module(module_name), attribute)
    if kind.name != entry.name:
        raise RuntimeError(f"{entry.implementation} is named {kind.name!r}, but its entry in SERVER_KINDS says {entry.name!r}")
    return kind


KINDS: dict[str, ServerKind] = {entry.name: _load(entry) for entry in SERVER_KINDS}
DEFAULT_KIND = DEFAULT_SERVER_KIND

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
