"""Run a container detached, ask for its state, save its logs, stop and remove it: every call an argument list
to the runtime, logged (runtime.run_logged). `start` with `dry_run` returns the argv without running it.

Containers run with `--init` (a Python or tritonserver PID 1 would not get SIGTERM handled as usual, and `stop`
would wait out its whole timeout) and carry labels, so the ones a deployment started are found by label and
removed even when their name was lost.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from trtllm_forge.containers.mounts import Mount
from trtllm_forge.containers.runtime import ContainerRuntime

OWNER_LABEL = "org.trtllm-forge.owner"  # = "trtllm-forge" on every container started here
DEPLOYMENT_LABEL = "org.trtllm-forge.deployment"  # the deployment (workdir) a container serves
RUN_LABEL = "org.trtllm-forge.run"  # which start of the deployment (its run id in deploy/state.json)
OWNER = "trtllm-forge"
STOP_GRACE_S = 10


@dataclass(frozen=True)
class ContainerSpec:
    """A detached container: `network_host` shares the host's network (the server binds where it is told);
    otherwise `published` maps host ports to container ports on `publish_address`."""

    name: str
    image: str
    command: list[str]
    mounts: list[Mount] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    network_host: bool = False
    published: dict[int, int] = field(default_factory=dict)  # host port -> container port
    publish_address: str = "127.0.0.1"
    shm_size: str = "1g"  # the python backend's tensors go through /dev/shm (64 MB by default)


@dataclass(frozen=True)
class ContainerState:
    status: str  # "running", "exited", "created", ... as the runtime says
    exit_code: int
    pid: int | None = None  # its first process on this host (while it runs)
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def running(self) -> bool:
        return self.status == "running"

    @property
    def ended(self) -> bool:
        """It ran and is over (a container still being created or started is not)."""
        return self.status in ENDED_STATES


ENDED_STATES = ("exited", "stopped", "dead", "removing")
# The container's state and labels in one line (podman and docker both read Go templates).
INSPECT_FORMAT = '{"State": {{json .State}}, "Labels": {{json .Config.Labels}}}'


def run_argv(runtime: ContainerRuntime, spec: ContainerSpec) -> list[str]:
    argv = runtime.argv("run", "--detach", "--init", "--name", spec.name, f"--shm-size={spec.shm_size}")
    for key, value in {OWNER_LABEL: OWNER, **spec.labels}.items():
        argv += ["--label", f"{key}={value}"]
    if spec.network_host:
        argv += ["--network", "host"]
    for host_port, container_port in spec.published.items():
        argv += ["--publish", f"{spec.publish_address}:{host_port}:{container_port}"]
    for mount in spec.mounts:
        argv += ["--volume", mount.volume()]
    for key, value in spec.env.items():
        argv += ["--env", f"{key}={value}"]
    return [*argv, spec.image, *spec.command]


def start(runtime: ContainerRuntime, spec: ContainerSpec, log: Path, *, dry_run: bool = False) -> list[str]:
    """Start the container (a stopped one of the same name is removed first); returns the `run` argv."""
    argv = run_argv(runtime, spec)
    if not dry_run:
        runtime.run(["rm", "--force", spec.name], log, check=False)
        runtime.run(argv[1:], log)
    return argv


def state(runtime: ContainerRuntime, name: str, log: Path) -> ContainerState | None:
    """The container's state, None when there is no container of that name."""
    proc = runtime.run(["inspect", "--format", INSPECT_FORMAT, name], log, check=False)
    if proc.returncode != 0:
        return None
    inspected = json.loads(proc.stdout.strip().splitlines()[-1])
    fields, labels = inspected.get("State") or {}, inspected.get("Labels") or {}
    return ContainerState(
        str(fields.get("Status", "")).lower(),
        int(fields.get("ExitCode") or 0),
        int(fields.get("Pid") or 0) or None,
        {str(key): str(value) for key, value in labels.items()},
    )


def save_logs(runtime: ContainerRuntime, name: str, log: Path, server_log: Path) -> None:
    """The container's output (stdout and stderr) into `server_log`."""
    proc = runtime.run(["logs", name], log, check=False)
    server_log.parent.mkdir(parents=True, exist_ok=True)
    server_log.write_text(proc.stdout + proc.stderr)


def stop(runtime: ContainerRuntime, name: str, log: Path, server_log: Path | None = None, grace_s: int = STOP_GRACE_S) -> None:
    """SIGTERM (SIGKILL after `grace_s`), its logs saved to `server_log`, then removed. Nothing to do when gone."""
    if state(runtime, name, log) is None:
        return
    runtime.run(["stop", "--time", str(grace_s), name], log, check=False, timeout_s=grace_s + 60.0)
    if server_log is not None:
        save_logs(runtime, name, log, server_log)
    runtime.run(["rm", "--force", name], log, check=False)


def labeled(runtime: ContainerRuntime, log: Path, labels: dict[str, str] | None = None) -> list[str]:
    """Names of the containers (running or not) started here that carry every label of `labels`."""
    wanted = {OWNER_LABEL: OWNER, **(labels or {})}
    filters = [arg for key, value in wanted.items() for arg in ("--filter", f"label={key}={value}")]
    proc = runtime.run(["ps", "--all", *filters, "--format", "{{.Names}}"], log)
    return proc.stdout.split()
