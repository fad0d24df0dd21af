"""`<wd>/deploy/state.json`: what a running (or stopped) Triton deployment looks like to other commands and scripts
(the triton server kind's record, read back by `deploy/kinds/triton.py`)."""

from __future__ import annotations

import json
import time
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from trtllm_forge.deploy.kinds.protocol import Speaks
from trtllm_forge.errors import StepError
from trtllm_forge.locks import file_lock
from trtllm_forge.stages import write_json_atomic

# A `deploy stop` holds the lock through its grace period (20 s by default) and the SIGKILL wait.
LOCK_WAIT_S = 60.0


class ServerUrls:
    """Client URLs of a server reachable at `host` on `ports` (http, grpc, metrics)."""

    host: str
    ports: dict[str, int]

    @property
    def grpc_url(self) -> str:
        return f"{self.host}:{self.ports['grpc']}"

    @property
    def http_url(self) -> str:
        return f"http://{self.host}:{self.ports['http']}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.host}:{self.ports['metrics']}/metrics"


@dataclass
class TritonDeployment(ServerUrls):
    """A Triton server started by `deploy` or `run`: the record in state.json (a `kinds.Deployment`). Where it runs
    (`target`): "local", a process group here (`pid`, `pgid`, `run_id`); "docker", a container of the CPU image
    (`container`, `image`, `runtime`; `run_id` is its label, `pid` its first process while it runs)."""

    running: bool
    pid: int | None
    pgid: int | None
    host: str  # where clients connect (loopback when the server binds a wildcard address)
    bind_address: str
    ports: dict[str, int]  # http, grpc, metrics
    repository: str
    models: dict[str, bool]  # name -> ready
    started_at: str
    command: list[str]
    log: str
    workdir: str
    target: str = "local"
    stopped_at: str | None = None
    env: dict[str, str] = field(default_factory=dict)  # what deploy added to the server's environment
    # The run mark (processes.RUN_MARK) in the environment of the server and of the python stubs it starts:
    # how `deploy stop` and the next `deploy` recognise the stubs a killed server left in its group.
    run_id: str | None = None
    container: str | None = None  # the container's name (target docker)
    image: str | None = None  # the image it runs
    runtime: str | None = None  # podman or docker

    @property
    def speaks(self) -> Speaks:
        return Speaks.TRITON

    @property
    def served_model(self) -> str | None:
        return None  # clients name the config's Triton models

    @property
    def where(self) -> str:
        """The server in words: its container, else its pid."""
        return f"container {self.container}" if self.container else f"pid {self.pid}"

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(grpc_url=self.grpc_url, http_url=self.http_url, metrics_url=self.metrics_url)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TritonDeployment:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def now() -> str:
    """A record's timestamp (UTC)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def state_path(workdir: Path) -> Path:
    return Path(workdir) / "deploy" / "state.json"


def lock_path(workdir: Path) -> Path:
    return Path(workdir) / "deploy" / "state.lock"


def deploy_lock(workdir: Path, wait_s: float = LOCK_WAIT_S) -> AbstractContextManager[None]:
    """Serialise what changes a workdir's deployment (start's check-and-launch, stop): a second `deploy` waits
    for the first to have launched and recorded its server, then sees it running."""

    def busy(holder: int | None) -> StepError:
        who = f"pid {holder}" if holder else "another process"
        return StepError(
            "deploy",
            f"{who} has held the deploy lock of {workdir} for {wait_s:g}s (starting or stopping its server)",
            f"wait for it, then `trtllm-forge deploy status --workdir {workdir}`",
        )

    return file_lock(lock_path(workdir), wait_s=wait_s, busy=busy)


def write_state(deployment: TritonDeployment) -> Path:
    path = state_path(Path(deployment.workdir))
    write_json_atomic(path, deployment.to_dict())
    return path


def read_state(workdir: Path) -> TritonDeployment | None:
    path = state_path(workdir)
    if not path.is_file():
        return None
    try:
        return TritonDeployment.from_dict(json.loads(path.read_text()))
    except (json.JSONDecodeError, TypeError, KeyError):
        return None
