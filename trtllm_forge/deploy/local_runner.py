"""A Triton deployment as a process group on this host (deploy.target: local).

The server runs in its own session (process group), so Ctrl-C in the terminal does not reach it and a stop can
signal it together with the python-backend stubs it starts. The group and a run mark in the server's environment
(inherited by the stubs) are recorded in state.json: when the server dies and leaves its stubs behind, `deploy stop`
and the next `deploy` find them by the group and stop them once the mark says they are ours.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from trtllm_forge import third_party_env
from trtllm_forge.deploy.discovery import STUB, prepare_backend_dir
from trtllm_forge.deploy.health import stub_health
from trtllm_forge.deploy.kinds.protocol import ProcessStatus
from trtllm_forge.deploy.launch import LaunchPlan, plan_launch
from trtllm_forge.deploy.runner import ServerPlan
from trtllm_forge.deploy.state import TritonDeployment, now, write_state
from trtllm_forge.errors import StepError
from trtllm_forge.processes import (
    RUN_MARK,
    UNREADABLE,
    cmdline,
    group_members,
    new_run_id,
    proc_stat,
    run_mark_of,
    spawn_in_session,
    terminate,
)
from trtllm_forge.stages import open_new_log
from trtllm_forge.ui import info

if TYPE_CHECKING:
    from trtllm_forge.config.schema import ForgeConfig

# Servers started by this process, so they are reaped (no zombies) when stopped from here.
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


def _reap(pid: int) -> None:
    child = _CHILDREN.get(pid)
    if child is not None and child.poll() is not None:
        _CHILDREN.pop(pid, None)


def pid_alive(pid: int | None) -> bool:
    """True while the process exists and is not a zombie (an orphan may sit unreaped as a zombie)."""
    if not pid:
        return False
    _reap(pid)
    stat = proc_stat(pid)
    if stat is None:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return not Path("/proc").is_dir() or Path(f"/proc/{pid}").exists()
    return stat[0] != "Z"


def _started_by(deployment: TritonDeployment, pid: int) -> bool:
    """Whether `pid` was started by this deployment: it carries the deployment's run mark or, for state
    written before run marks existed (or a process whose environment we may not read), runs the recorded
    server binary or a python stub of its repository."""
    mark = run_mark_of(pid) if deployment.run_id else UNREADABLE
    if mark != UNREADABLE:
        return mark == deployment.run_id
    argv = cmdline(pid)
    if not argv:
        return False
    if deployment.command and Path(argv[0]).name == Path(deployment.command[0]).name:
        return True
    return Path(argv[0]).name == STUB and len(argv) > 1 and argv[1].startswith(deployment.repository.rstrip("/") + "/")


def our_processes(deployment: TritonDeployment) -> list[int]:
    """Live processes of the deployment's recorded group that it started (server and python stubs)."""
    pgid = deployment.pgid or deployment.pid
    return [pid for pid in group_members(pgid) if _started_by(deployment, pid)]


def is_our_server(deployment: TritonDeployment) -> bool:
    """Guard against a recycled pid: the process must be the one this deployment started."""
    if deployment.pid is None or not pid_alive(deployment.pid):
        return False
    if not Path(f"/proc/{deployment.pid}").is_dir():
        return True
    return _started_by(deployment, deployment.pid)


def leftover_processes(deployment: TritonDeployment) -> list[int]:
    """Processes a dead server left running (its python stubs keep running after a SIGKILL of the server)."""
    return [] if is_our_server(deployment) else our_processes(deployment)


def _stub_shm_regions(pids: list[int]) -> list[Path]:
    """Shared-memory files of the python stubs among `pids` (argv[2] of each stub names its region)."""
    regions = []
    for pid in pids:
        argv = cmdline(pid)
        if len(argv) > 2 and Path(argv[0]).name == STUB:
            name = argv[2]
            if "/" not in name:
                regions.append(Path("/dev/shm") / name)
    return regions


def terminate_processes(find: Callable[[], list[int]], pid: int | None, grace_s: float, quiet: bool, what: str) -> None:
    """SIGTERM what `find()` returns, SIGKILL after the grace period, and remove the shared memory its python
    stubs leave behind (stubs killed before they clean up leave their region)."""
    regions = _stub_shm_regions(find())

    def alive() -> list[int]:
        if pid:
            _reap(pid)
        return find()

    if not alive():
        return
    if not quiet:
        info(f"stopping {what}: SIGTERM, SIGKILL after {grace_s:g}s")
    survivors = terminate(alive, grace_s)
    if survivors:
        raise StepError("deploy stop", f"processes {survivors} of {what} survived SIGKILL", "check them with ps")
    for region in regions:
        region.unlink(missing_ok=True)


def stop_group(pgid: int, pid: int | None, grace_s: float = 20.0, quiet: bool = False) -> None:
    """SIGTERM a server's whole process group, SIGKILL after the grace period (for servers started without a
    deployment record; a deployment's processes are stopped by server.stop_server, which checks they are ours)."""
    terminate_processes(lambda: group_members(pgid), pid, grace_s, quiet, f"process group {pgid}")


def _launch_plan(plan: ServerPlan) -> LaunchPlan:
    if not isinstance(plan, LaunchPlan):
        raise TypeError(f"the local runner was handed a {type(plan).__name__}")
    return plan


@dataclass(frozen=True)
class LocalRunner:
    """tritonserver (or the rendered MPI command) as a process group here."""

    where: str = "local"

    def plan(self, config: ForgeConfig, workdir: Path, repository: Path | None) -> ServerPlan:
        return plan_launch(config, workdir, repository)

    def dry_run_sections(self, plan: ServerPlan, state: Path) -> list[tuple[str, list[str]]]:
        launch = _launch_plan(plan)
        return [
            ("would run (ports 0 are picked again at a real start):", [shlex.join(launch.argv)]),
            ("environment added:", [f"{key}={value}" for key, value in launch.env.items()]),
            (
                "files:",
                [
                    *(f"{dest} <- {source}" for dest, source in launch.backend_files.items()),
                    f"{launch.log} (server log)",
                    f"{state} (deployment state)",
                ],
            ),
            (f"models to wait for: {', '.join(launch.models)}", []),
        ]

    def prepare(self, plan: ServerPlan) -> None:
        launch = _launch_plan(plan)
        if launch.backend_dir is not None:
            prepare_backend_dir(launch.install, launch.backend_dir)

    def launch(self, plan: ServerPlan, workdir: Path, *, die_with_caller: bool) -> TritonDeployment:
        """Start the server (previous log rotated, not overwritten) and record it in state.json before waiting,
        so `deploy stop` and a concurrent `deploy` can find a server that hangs. With die_with_caller it gets
        SIGKILL when this process dies, even by SIGKILL."""
        launch = _launch_plan(plan)
        info(f"[dim]$ {shlex.join(launch.argv)}[/dim]")
        run_id = new_run_id()
        with open_new_log(launch.log) as log:
            log.write(f"$ {shlex.join(launch.argv)}\n")
            log.flush()
            try:
                proc = spawn_in_session(
                    launch.argv,
                    log,
                    env={**third_party_env(), **launch.env, RUN_MARK: run_id},
                    cwd=workdir,
                    die_with_caller=die_with_caller,
                )
            except FileNotFoundError:
                raise StepError("deploy", f"command not found: {launch.argv[0]}", "install it or fix PATH") from None
        _CHILDREN[proc.pid] = proc
        deployment = TritonDeployment(
            running=False,
            pid=proc.pid,
            pgid=proc.pid,  # start_new_session: the server leads its own group
            host=launch.host,
            bind_address=launch.bind_address,
            ports=launch.ports,
            repository=str(launch.repository),
            models={name: False for name in launch.models},
            started_at=now(),
            command=launch.argv,
            log=str(launch.log),
            workdir=str(workdir),
            target=self.where,
            env=launch.env,
            run_id=run_id,
        )
        write_state(deployment)
        return deployment

    def exit_code(self, deployment: TritonDeployment) -> int | None:
        child = _CHILDREN.get(deployment.pid or -1)
        if child is not None:
            return child.poll()
        return None if is_our_server(deployment) else -1

    def port_taken(self, deployment: TritonDeployment) -> bool:
        try:
            return "already in use" in Path(deployment.log).read_text(errors="replace")
        except OSError:
            return False

    def is_ours(self, deployment: TritonDeployment) -> bool:
        return is_our_server(deployment)

    def health(self, deployment: TritonDeployment) -> list[str]:
        return stub_health(deployment.pgid or deployment.pid, Path(deployment.repository)).problems()

    def dead_models(self, deployment: TritonDeployment) -> list[str]:
        return list(stub_health(deployment.pgid or deployment.pid, Path(deployment.repository)).missing)

    def terminate(self, deployment: TritonDeployment, grace_s: float) -> None:
        if pid_alive(deployment.pid) and not is_our_server(deployment):
            info(f"pid {deployment.pid} now runs another program; not signalling it")
        terminate_processes(lambda: our_processes(deployment), deployment.pid, grace_s, True, f"the server (pid {deployment.pid})")
        child = _CHILDREN.pop(deployment.pid or -1, None)
        if child is not None:
            with suppress(subprocess.TimeoutExpired):
                child.wait(timeout=5)

    def leftovers(self, deployment: TritonDeployment) -> list[int]:
        return leftover_processes(deployment)

    def ended(self, deployment: TritonDeployment) -> str | None:
        return None  # a dead local server is told by its pid and the processes it left

    def process(self, deployment: TritonDeployment) -> ProcessStatus:
        return ProcessStatus("tritonserver", deployment.pid, is_our_server(deployment), deployment.running, deployment.log)

    def save_log(self, deployment: TritonDeployment) -> None:
        return None  # the server writes deployment.log itself


LOCAL_RUNNER = LocalRunner()
