"""A Triton deployment as a container of the CPU image (deploy.target: docker, CPU engines).

The image is built or reused by `containers/image.py` (keyed by its content), the container is started detached by
`containers/run.py` with `containers/serve.py`'s spec: the repository and every path its models read mounted
read-only at the same path, the server on 0.0.0.0:8000-8002 inside and the host's ports (free ones for port 0)
published on triton.bind_address (127.0.0.1 by default). Readiness, status, smoke, verify and bench go through
the published ports. The container carries the workdir and the start's run id as labels: status checks the
label, and a stop removes every container labelled with the workdir, so nothing is left.

The python stubs are checked as a local server's are: the container's processes are visible on this host, and its
tritonserver (the child of the container's init) leads a process group holding its stubs. Not here: dying with the
caller (a detached container outlives a SIGKILL of `run`; `deploy stop` or the next `deploy` removes it).
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtllm_forge.containers import run as containers
from trtllm_forge.containers.runtime import ContainerRuntime, find_runtime
from trtllm_forge.deploy.health import StubHealth, stub_health
from trtllm_forge.deploy.kinds.protocol import ProcessStatus
from trtllm_forge.deploy.launch import connect_host, repository_models, resolve_ports
from trtllm_forge.deploy.runner import CONTAINER_TARGET, PortTaken, ServerPlan
from trtllm_forge.deploy.server_argv import CONTAINER_PORTS, bind_address
from trtllm_forge.deploy.state import TritonDeployment, now, write_state
from trtllm_forge.errors import StepError
from trtllm_forge.processes import all_pids, new_run_id, proc_stat
from trtllm_forge.stages import open_new_log
from trtllm_forge.ui import info

if TYPE_CHECKING:
    from trtllm_forge.config.schema import ForgeConfig

STOP_GRACE_CAP_S = 60  # `podman stop --time` takes whole seconds
STOP_GRACE_S = 20.0  # `deploy stop`'s default --grace


def runtime_log(workdir: Path | str) -> Path:
    """Every runtime command of a deployment (run, inspect, stop, logs, rm) with its output."""
    return Path(workdir) / "logs" / "container-runtime.log"


@dataclass
class ContainerPlan:
    """What a container start runs: the image (and how it is built when absent), the `run` argv, the ports."""

    runtime: ContainerRuntime
    spec: containers.ContainerSpec
    repository: Path
    models: list[str]
    ports: dict[str, int]  # on this host (published)
    bind_address: str  # where they are published
    log: Path  # the container's output, saved at a stop
    runtime_log: Path
    image_present: bool
    build_commands: list[list[str]] = field(default_factory=list)  # a build from nothing, when the image is absent
    configured_image: bool = False  # deploy.image names it: never built here

    def run_commands(self) -> list[list[str]]:
        return [self.runtime.argv("rm", "--force", self.spec.name), containers.run_argv(self.runtime, self.spec)]

    def stop_commands(self, grace_s: float) -> list[list[str]]:
        name = self.spec.name
        seconds = str(min(int(grace_s), STOP_GRACE_CAP_S))
        return [
            self.runtime.argv("stop", "--time", seconds, name),
            self.runtime.argv("logs", name),
            self.runtime.argv("rm", "--force", name),
        ]

    def describe(self) -> dict[str, Any]:
        run = containers.run_argv(self.runtime, self.spec)
        return {
            "where": CONTAINER_TARGET,
            "runtime": self.runtime.name,
            "runtime_env": self.runtime.env,
            "image": self.spec.image,
            "image_present": self.image_present,
            "image_build": [shlex.join(argv) for argv in ([] if self.image_present else self.build_commands)],
            "container": self.spec.name,
            "argv": run,
            "command": shlex.join(run),
            "commands": [shlex.join(argv) for argv in self.run_commands()],
            "mounts": [mount.volume() for mount in self.spec.mounts],
            "repository": str(self.repository),
            "models": self.models,
            "ports": self.ports,
            "container_ports": CONTAINER_PORTS,
            "bind_address": self.bind_address,
            "files": {str(self.log): "(server log: the container's output, saved when it stops)", str(self.runtime_log): "(runtime log)"},
        }


def _shell_lines(runtime: ContainerRuntime, commands: list[list[str]]) -> list[str]:
    """The commands as a shell runs them: the runtime's environment (podman's CONTAINERS_CONF) first."""
    env = [f"{key}={value}" for key, value in runtime.env.items()]
    return [shlex.join([*env, *argv]) for argv in commands]


def _container_plan(plan: ServerPlan) -> ContainerPlan:
    if not isinstance(plan, ContainerPlan):
        raise TypeError(f"the container runner was handed a {type(plan).__name__}")
    return plan


def _image(config: ForgeConfig, runtime: ContainerRuntime) -> tuple[str, bool, list[list[str]]]:
    """(tag, present, commands of a build from nothing): deploy.image, else the CPU image of this source tree."""
    from trtllm_forge.containers.image import ensure_image, image_exists

    quiet = Path(os.devnull)
    if config.deploy.image:
        return config.deploy.image, image_exists(runtime, config.deploy.image, quiet), []
    planned = ensure_image(runtime, quiet, dry_run=True)
    return planned.tag, image_exists(runtime, planned.tag, quiet), planned.commands


@dataclass(frozen=True)
class ContainerRunner:
    """tritonserver in a container of the CPU image, reached through published ports."""

    where: str = CONTAINER_TARGET

    def plan(self, config: ForgeConfig, workdir: Path, repository: Path | None) -> ServerPlan:
        from trtllm_forge.containers.serve import serving_spec
        from trtllm_forge.deploy.launch import default_repository

        repository = (repository or default_repository(workdir)).resolve()
        models = repository_models(repository)
        runtime = find_runtime()
        image, present, build = _image(config, runtime)
        address = bind_address(config, in_container=False)
        ports = resolve_ports(config)
        return ContainerPlan(
            runtime=runtime,
            spec=serving_spec(image, repository, workdir, ports, host_address=address),
            repository=repository,
            models=models,
            ports=ports,
            bind_address=address,
            log=workdir / "logs" / "tritonserver.log",
            runtime_log=runtime_log(workdir),
            image_present=present,
            build_commands=build,
            configured_image=bool(config.deploy.image),
        )

    def dry_run_sections(self, plan: ServerPlan, state: Path) -> list[tuple[str, list[str]]]:
        container = _container_plan(plan)
        image: list[tuple[str, list[str]]]
        if container.image_present:
            image = [(f"image {container.spec.image}: present", [])]
        elif container.configured_image:
            image = [(f"image {container.spec.image} (deploy.image) is not in {container.runtime.name}'s storage: load it first", [])]
        else:
            image = [(f"image {container.spec.image} is not built yet; a start builds it first (minutes; `make image` does it ahead):", [])]
            image.append(("", _shell_lines(container.runtime, container.build_commands)))
        return [
            *image,
            ("would run (ports 0 are picked again at a real start):", _shell_lines(container.runtime, container.run_commands())),
            (
                f"then wait for {', '.join(container.models)} through http://{connect_host(container.bind_address)}:{container.ports['http']}",
                [],
            ),
            ("`deploy stop` runs:", _shell_lines(container.runtime, container.stop_commands(STOP_GRACE_S))),
            (
                "files:",
                [
                    f"{container.log} (the container's output, saved when it stops)",
                    f"{container.runtime_log} (runtime commands)",
                    f"{state} (deployment state)",
                ],
            ),
        ]

    def prepare(self, plan: ServerPlan) -> None:
        from trtllm_forge.containers.image import ensure_image

        container = _container_plan(plan)
        if container.configured_image:
            return  # the user's image: podman run reports it when it is missing
        if not container.image_present:
            info(f"building the CPU serving image {container.spec.image} (minutes; log {container.runtime_log})")
        build = ensure_image(container.runtime, container.runtime_log)
        if build.built:
            info(f"built {build.tag} ({', '.join(f'{step} {seconds:.0f} s' for step, seconds in build.seconds.items())})")

    def launch(self, plan: ServerPlan, workdir: Path, *, die_with_caller: bool) -> TritonDeployment:
        """`run --detach` the container (an earlier one of this workdir is removed first) and record it. The
        container outlives this process whatever die_with_caller says (a stop removes it)."""
        container = _container_plan(plan)
        run_id = new_run_id()
        spec = replace(container.spec, labels={**container.spec.labels, containers.RUN_LABEL: run_id})
        argv = containers.run_argv(container.runtime, spec)
        info(f"[dim]$ {shlex.join(argv)}[/dim]")
        with open_new_log(container.log) as log:
            log.write(
                f"$ {shlex.join(argv)}\n(the container's output is saved here when it stops; until then: {container.runtime.name} logs {spec.name})\n"
            )
        try:
            containers.start(container.runtime, spec, container.runtime_log)
        except StepError as exc:
            if "already in use" in str(exc) or "already in use" in _tail(container.runtime_log):
                container.runtime.run(["rm", "--force", spec.name], container.runtime_log, check=False)
                raise PortTaken() from None
            raise
        state = containers.state(container.runtime, spec.name, container.runtime_log)
        deployment = TritonDeployment(
            running=False,
            pid=state.pid if state else None,
            pgid=None,
            host=connect_host(container.bind_address),
            bind_address=container.bind_address,
            ports=container.ports,
            repository=str(container.repository),
            models={name: False for name in container.models},
            started_at=now(),
            command=argv,
            log=str(container.log),
            workdir=str(workdir),
            target=self.where,
            run_id=run_id,
            container=spec.name,
            image=spec.image,
            runtime=container.runtime.name,
        )
        write_state(deployment)
        return deployment

    def _state(self, deployment: TritonDeployment) -> containers.ContainerState | None:
        if not deployment.container:
            return None
        return containers.state(find_runtime(), deployment.container, runtime_log(deployment.workdir))

    def _ours(self, deployment: TritonDeployment, state: containers.ContainerState | None) -> bool:
        return state is not None and state.labels.get(containers.RUN_LABEL) == deployment.run_id

    def exit_code(self, deployment: TritonDeployment) -> int | None:
        state = self._state(deployment)
        if not self._ours(deployment, state) or state is None:
            return -1
        return state.exit_code if state.ended else None

    def port_taken(self, deployment: TritonDeployment) -> bool:
        return False  # the runtime binds the published ports at `run`: launch raises PortTaken

    def is_ours(self, deployment: TritonDeployment) -> bool:
        state = self._state(deployment)
        return state is not None and state.running and self._ours(deployment, state)

    def _stubs(self, deployment: TritonDeployment) -> StubHealth:
        state = self._state(deployment)
        group = _server_group(state.pid) if state is not None and state.running else None
        return stub_health(group, Path(deployment.repository))

    def health(self, deployment: TritonDeployment) -> list[str]:
        return self._stubs(deployment).problems()

    def dead_models(self, deployment: TritonDeployment) -> list[str]:
        return list(self._stubs(deployment).missing)

    def terminate(self, deployment: TritonDeployment, grace_s: float) -> None:
        """Stop the recorded container (its output saved to deployment.log) and remove every container labelled
        with this workdir."""
        runtime, log = find_runtime(), runtime_log(deployment.workdir)
        if deployment.container:
            containers.stop(runtime, deployment.container, log, Path(deployment.log), grace_s=min(int(grace_s), STOP_GRACE_CAP_S))
        for name in containers.labeled(runtime, log, {containers.DEPLOYMENT_LABEL: str(Path(deployment.workdir).resolve())}):
            runtime.run(["rm", "--force", name], log, check=False)

    def leftovers(self, deployment: TritonDeployment) -> list[int]:
        return []  # a container's processes end with it

    def ended(self, deployment: TritonDeployment) -> str | None:
        state = self._state(deployment)
        name = deployment.container
        if state is None:
            return f"container {name} is gone (removed)"
        if not self._ours(deployment, state):
            return f"container {name} is another start's (run label {state.labels.get(containers.RUN_LABEL)})"
        if state.ended:
            killed = " (killed)" if state.exit_code == 137 else ""
            return f"container {name} {state.status} with code {state.exit_code}{killed}; its output: {deployment.runtime} logs {name}"
        return None

    def process(self, deployment: TritonDeployment) -> ProcessStatus:
        state = self._state(deployment)
        alive = state is not None and state.running and self._ours(deployment, state)
        pid = state.pid if state is not None else None
        return ProcessStatus(f"container {deployment.container}", pid, alive, deployment.running, deployment.log)

    def save_log(self, deployment: TritonDeployment) -> None:
        if deployment.container:
            runtime, log = find_runtime(), runtime_log(deployment.workdir)
            if containers.state(runtime, deployment.container, log) is not None:
                containers.save_logs(runtime, deployment.container, log, Path(deployment.log))


def _server_group(init_pid: int | None) -> int | None:
    """The process group of the container's server as this host sees it: the child of the container's init
    (`--init`), tritonserver, leads it, and its python stubs are in it, as for a local server. None when this
    host does not see the container's processes (a remote docker engine): nothing is then checked."""
    if not init_pid or not Path("/proc").is_dir():
        return None
    for pid in all_pids():
        stat = proc_stat(pid)
        if stat is not None and stat[1] == init_pid:
            return stat[2]
    return None


def _tail(log: Path) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-5:])
    except OSError:
        return ""


CONTAINER_RUNNER = ContainerRunner()
