"""The contract every server kind (`deploy.server`) implements, and the typed deployment it hands to smoke, verify
and bench.

A kind owns everything that differs between servers: its command lines, where it records what it started, how it
tells alive from dead and ready from not, what clients it speaks to (Triton's KServe v2 or OpenAI's API), the
config rules it imposes and the bench target it offers. Everything outside `deploy/kinds/` asks the kind (found by
`kinds.kind_of(config)` or, without a config, `kinds.deployed(workdir)`) and switches at most on `Speaks`, never on
a kind's name. A deployment may run several processes (a frontend and N workers): status reports each one.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from trtllm_forge.errors import ConfigError

if TYPE_CHECKING:
    from trtllm_forge.config.schema import ForgeConfig

NOT_RUNNING_EXIT = 3  # `deploy status` when no server runs, so scripts can tell it from an error (1, 2)
UNHEALTHY_EXIT = 1  # `deploy status` when it runs but a process is dead or a served model is not ready


class Speaks(StrEnum):
    """The protocol clients use to talk to a deployment: what smoke, verify and bench switch on."""

    TRITON = "triton"  # KServe v2 over gRPC/HTTP (client.generate, the llmapi tensors, bench's triton-* targets)
    OPENAI = "openai"  # /v1/completions over HTTP (llmapi_requests.openai_generate, bench's openai target)


@runtime_checkable
class Deployment(Protocol):
    """A deployment read back from its kind's state file (or handed over by `run`), typed."""

    @property
    def speaks(self) -> Speaks: ...

    @property
    def running(self) -> bool: ...

    @property
    def pid(self) -> int | None:
        """The process clients reach (Triton's server, trtllm-serve, a frontend)."""

    @property
    def where(self) -> str:
        """The process clients reach, in words: "pid 123", "container trtllm-forge-wd-1a2b3c4d"."""

    @property
    def log(self) -> str: ...

    @property
    def http_url(self) -> str: ...

    @property
    def grpc_url(self) -> str:
        """Triton's gRPC host:port; a kind without gRPC says so in words (it is shown, never dialled)."""

    @property
    def metrics_url(self) -> str | None: ...

    @property
    def served_model(self) -> str | None:
        """The model id OpenAI clients name; None when clients name the config's Triton models."""

    def to_dict(self) -> dict[str, Any]: ...


@dataclass
class ProcessStatus:
    """One process of a deployment as `deploy status` shows it."""

    role: str  # e.g. tritonserver, trtllm-serve, frontend, worker-0
    pid: int | None
    alive: bool  # the recorded process still runs what was started
    ready: bool  # it answers its health check
    log: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class DeploymentStatus:
    """A kind's answer to `deploy status`: the deployment, each of its processes, and what is wrong."""

    server: str  # the kind's name (deploy.server)
    deployment: Deployment
    processes: list[ProcessStatus]
    endpoints: dict[str, bool] = field(default_factory=dict)  # what clients call (Triton: its models) -> ready
    problems: list[str] = field(default_factory=list)  # running but unhealthy: why; not running: why it ended, if known
    leftover_pids: list[int] = field(default_factory=list)  # processes a dead deployment left running
    restart: str = "`trtllm-forge deploy stop` and `trtllm-forge deploy`"  # what brings it back, for the problems' hint

    @property
    def running(self) -> bool:
        return self.deployment.running

    @property
    def exit_code(self) -> int:
        """0 running and healthy; 1 running with a dead process or a problem; 3 not running."""
        if not self.running:
            return NOT_RUNNING_EXIT
        if self.problems or not all(p.alive for p in self.processes):
            return UNHEALTHY_EXIT
        return 0

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.deployment.to_dict(),
            "server": self.server,
            "speaks": str(self.deployment.speaks),
            "processes": [p.to_dict() for p in self.processes],
            "problems": self.problems,
            "leftover_pids": self.leftover_pids,
        }


@dataclass
class Rendering:
    """A docker or Kubernetes rendering of a deployment: the file to write and its text (nothing is contacted)."""

    path: Path
    text: str
    executable: bool = False
    note: str = "rendered only: no Docker engine or cluster is contacted"  # why it is written, not run


@dataclass
class LocalPlan:
    """What a local start would run (`deploy --dry-run`): the JSON document, and for people, sections of a heading
    (to stderr) and lines (to stdout: commands and files to copy)."""

    document: dict[str, Any]
    sections: list[tuple[str, list[str]]]


@runtime_checkable
class ServerKind(Protocol):
    """One value of `deploy.server`: an instance in its module under deploy/kinds/, named by its entry in
    `trtllm_forge/server_kinds.py` `SERVER_KINDS` (with its summary and config rules)."""

    name: str  # the deploy.server value, as its entry in trtllm_forge/server_kinds.py names it
    speaks: Speaks
    default_bench_target: str  # the bench target a workload gets when it names none

    def serves_bench_target(self, target: str) -> bool: ...

    def runs(self, config: ForgeConfig) -> bool:
        """Whether `start`/`serving` run the config where its deploy.target says (always for local); when not,
        `deploy` writes `render`'s file for that target instead."""

    def render(self, config: ForgeConfig, workdir: Path, repository: Path, target: str) -> Rendering:
        """The docker or kubernetes rendering (`deploy --target docker|kubernetes` when `runs` is False)."""

    def plan_local(self, config: ForgeConfig, workdir: Path, repository: Path) -> LocalPlan:
        """What `deploy` would start here (`--dry-run`): writes nothing."""

    def start(self, config: ForgeConfig, workdir: Path, repository: Path, *, ready_timeout_s: float | None = None) -> Deployment:
        """Start it here and wait until it is ready; it keeps running after this process ends (`deploy`)."""

    def serving(self, config: ForgeConfig, workdir: Path, repository: Path, *, keep: bool = False) -> AbstractContextManager[Deployment]:
        """A running deployment for a `with` block (`run`): stopped on exit, and dies with this process, unless keep."""

    def read(self, workdir: Path) -> Deployment | None:
        """The deployment this kind recorded in the workdir (None: none recorded), with `running` checked now."""

    def health(self, deployment: Deployment) -> list[str]:
        """What is wrong with a running deployment, now (empty: healthy)."""

    def status(self, deployment: Deployment) -> DeploymentStatus:
        """Every process of the deployment, ready or dead, its endpoints and problems, checked now."""

    def stop(self, workdir: Path, *, grace_s: float) -> Deployment | None:
        """Stop every process this kind recorded in the workdir (SIGTERM, SIGKILL after grace_s); None: none recorded."""

    def query_examples(self, config: ForgeConfig, deployment: Deployment) -> str:
        """How a person queries the deployment (printed by `run`)."""


def refuse_unserved_bench_targets(config: ForgeConfig, kind: ServerKind) -> Iterator[ConfigError]:
    """bench.workloads[].target values the kind does not serve (a workload that names no target gets its default)."""
    for index, workload in enumerate(config.bench.workloads):
        target = getattr(workload, "target", None)  # a field bench/options.py adds to BenchWorkload
        if "target" in workload.model_fields_set and target is not None and not kind.serves_bench_target(target):
            yield ConfigError(
                f"bench.workloads[{index}].target",
                f"{target!r} is not served by deploy.server {kind.name}, which speaks {kind.speaks} only",
                f"set target: {kind.default_bench_target} (or leave it unset)",
            )


def openai_query_examples(deployment: Deployment) -> str:
    """How to query an OpenAI-speaking deployment with curl."""
    body = json.dumps({"model": deployment.served_model, "prompt": "The capital of France is", "max_tokens": 20})
    return (
        "query it with curl (OpenAI completions):\n"
        f"  curl -s {deployment.http_url}/v1/completions -H 'Content-Type: application/json' -d {shlex.quote(body)}"
    )


OPENAI_TARGET = "openai"  # the bench target that speaks OpenAI's API


class OpenAIKind:
    """What every OpenAI-speaking kind (trtllm-serve, Dynamo) shares: its clients, its one bench target, where it runs
    (local processes; its docker and Kubernetes targets are renderings), and how a person queries it."""

    speaks = Speaks.OPENAI
    default_bench_target = OPENAI_TARGET

    def serves_bench_target(self, target: str) -> bool:
        return target == OPENAI_TARGET

    def runs(self, config: ForgeConfig) -> bool:
        return config.deploy.target == "local"  # docker and Kubernetes: rendered only

    def query_examples(self, config: ForgeConfig, deployment: Deployment) -> str:
        return openai_query_examples(deployment)
