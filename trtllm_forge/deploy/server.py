"""Start, watch and stop a local Triton server; the Python API `run` and the tests use.

The server runs in its own session (process group), so Ctrl-C in the terminal does not reach it and
`stop` can signal it together with the python-backend stubs it starts. The group and a run mark in the
server's environment (inherited by the stubs) are recorded in state.json: when the server dies and leaves its
stubs behind, `deploy stop` and the next `deploy` find them by the group and stop them once the mark says they
are ours. Start and stop hold the workdir's deploy lock, so two commands never launch two servers.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from trtllm_forge import third_party_env
from trtllm_forge.config import ForgeConfig
from trtllm_forge.deploy.discovery import STUB, prepare_backend_dir
from trtllm_forge.deploy.health import stub_health
from trtllm_forge.deploy.launch import LaunchPlan, plan_launch
from trtllm_forge.deploy.state import TritonDeployment, deploy_lock, read_state, write_state
from trtllm_forge.errors import StepError
from trtllm_forge.processes import (
    RUN_MARK,
    UNREADABLE,
    cmdline,
    dying_with_parent,
    group_members,
    new_run_id,
    proc_stat,
    run_mark_of,
    terminate,
)
from trtllm_forge.stages import open_new_log
from trtllm_forge.ui import console, info

LOG_TAIL_LINES = 40
STOP_GRACE_S = 20.0
FAILED_START_GRACE_S = 5.0  # a server that failed to start has nothing worth a graceful shutdown
POLL_S = 0.25

# Servers started by this process, so they are reaped (no zombies) when stopped from here.
_CHILDREN: dict[int, subprocess.Popen] = {}


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


# ---- processes -------------------------------------------------------------------------------------------


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


# ---- readiness -------------------------------------------------------------------------------------------


def _http_ok(url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def server_live(http_url: str) -> bool:
    return _http_ok(f"{http_url}/v2/health/live")


def server_ready(http_url: str) -> bool:
    return _http_ok(f"{http_url}/v2/health/ready")


def model_readiness(http_url: str, models: list[str]) -> dict[str, bool]:
    return {name: _http_ok(f"{http_url}/v2/models/{name}/ready") for name in models}


def log_tail(log: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last lines of the server log, without blank lines and the server-options table (long, never the cause)."""
    try:
        text = Path(log).read_text(errors="replace")
    except OSError:
        return f"(no log at {log})"
    kept: list[str] = []
    in_options = False
    for line in text.splitlines():
        if line.startswith("| Option "):
            in_options = True
            kept = kept[:-1] if kept and kept[-1].startswith("+---") else kept
            continue
        if in_options:
            in_options = line.startswith(("|", "+"))
            if in_options:
                continue
        if line.strip():
            kept.append(line)
    return "\n".join(kept[-lines:])


_UNAVAILABLE = re.compile(r"^\|\s*(\S+)\s*\|\s*\d+\s*\|\s*UNAVAILABLE:\s*(.*?)\s*\|$", re.MULTILINE)


def failed_models(log: Path) -> dict[str, str]:
    """Model name -> first line of the reason, from the model status table Triton prints."""
    try:
        return dict(_UNAVAILABLE.findall(Path(log).read_text(errors="replace")))
    except OSError:
        return {}


# ---- start -----------------------------------------------------------------------------------------------


def _deployment_from_plan(plan: LaunchPlan, workdir: Path, proc: subprocess.Popen, target: str, run_id: str) -> TritonDeployment:
    return TritonDeployment(
        running=False,
        pid=proc.pid,
        pgid=proc.pid,  # start_new_session: the server leads its own group
        host=plan.host,
        bind_address=plan.bind_address,
        ports=plan.ports,
        repository=str(plan.repository),
        models={name: False for name in plan.models},
        started_at=_now(),
        command=plan.argv,
        log=str(plan.log),
        workdir=str(workdir),
        target=target,
        env=plan.env,
        run_id=run_id,
    )


def _fail(deployment: TritonDeployment, problem: str, valid: str) -> StepError:
    """Show the log tail, stop what is left, record the stop, and return the error to raise."""
    tail = log_tail(Path(deployment.log))
    console.print(f"--- last lines of {deployment.log} ---", markup=False, highlight=False)
    console.print(tail, markup=False, highlight=False)
    console.print("--- end of log ---", markup=False, highlight=False)
    stop_server(deployment, grace_s=FAILED_START_GRACE_S, quiet=True)
    return StepError("deploy", problem, valid)


class _PortTaken(Exception):
    """A port picked as free was taken by someone else before the server bound it."""


PORT_ATTEMPTS = 3


def start_server(
    config: ForgeConfig,
    workdir: Path,
    repository: Path | None = None,
    *,
    ready_timeout_s: float | None = None,
    die_with_caller: bool = False,
    launched: Callable[[TritonDeployment], None] | None = None,
) -> TritonDeployment:
    """Start tritonserver on the repository and wait until it is live and every model is ready.

    On any failure the server is stopped, the log tail is printed and a StepError is raised. Ports picked
    as free (configured 0) are picked again when another process takes one first. With die_with_caller the
    server gets SIGKILL when this process dies, even by SIGKILL (for servers that live only as long as a
    command such as `run`; `deploy` leaves its server running). `launched` is told each deployment as soon
    as its process exists, so a caller can stop it even when a signal interrupts the start.
    """
    workdir = Path(workdir).resolve()
    timeout = config.deploy.ready_timeout_s if ready_timeout_s is None else ready_timeout_s
    for attempt in range(1, PORT_ATTEMPTS + 1):
        with deploy_lock(workdir):
            _refuse_running_and_clear_leftovers(workdir)
            plan = plan_launch(config, workdir, repository)
            if attempt == 1 and plan.backend_dir is not None:
                prepare_backend_dir(plan.install, plan.backend_dir)
            proc, deployment = _launch(plan, workdir, die_with_caller)
            if launched is not None:
                launched(deployment)
        try:
            return _wait_ready(proc, deployment, plan, timeout, picked_ports=0 in _configured_ports(config))
        except _PortTaken:
            info(f"a port was taken before the server bound it; picking new ports (attempt {attempt + 1})")
    raise StepError("deploy", f"ports were taken by other processes {PORT_ATTEMPTS} times in a row", "set fixed triton ports")


def _refuse_running_and_clear_leftovers(workdir: Path) -> None:
    """With the deploy lock held: refuse a second server; stop what a dead earlier server left running."""
    previous = read_state(workdir)
    if previous is None:
        return
    if is_our_server(previous):
        raise StepError(
            "deploy",
            f"a server from this workdir is already running (pid {previous.pid}, grpc {previous.grpc_url})",
            f"stop it first: `trtllm-forge deploy stop --workdir {workdir}`",
        )
    leftovers = our_processes(previous)
    if leftovers:
        info(f"stopping {len(leftovers)} process(es) the dead server (pid {previous.pid}) left running: {leftovers}")
        stop_server(previous, grace_s=FAILED_START_GRACE_S, quiet=True)


def _configured_ports(config: ForgeConfig) -> list[int]:
    return [config.triton.http_port, config.triton.grpc_port, config.triton.metrics_port]


def _launch(plan: LaunchPlan, workdir: Path, die_with_caller: bool) -> tuple[subprocess.Popen, TritonDeployment]:
    """Start the server (previous log rotated, not overwritten) and record it in state.json before waiting,
    so `deploy stop` and a concurrent `deploy` can find a server that hangs."""
    info(f"[dim]$ {shlex.join(plan.argv)}[/dim]")
    run_id = new_run_id()
    with open_new_log(plan.log) as log:
        log.write(f"$ {shlex.join(plan.argv)}\n")
        log.flush()
        try:
            proc = subprocess.Popen(
                plan.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**third_party_env(), **plan.env, RUN_MARK: run_id},
                cwd=workdir,
                start_new_session=True,
                preexec_fn=dying_with_parent(new_group=False) if die_with_caller else None,
            )
        except FileNotFoundError:
            raise StepError("deploy", f"command not found: {plan.argv[0]}", "install it or fix PATH") from None
    _CHILDREN[proc.pid] = proc
    deployment = _deployment_from_plan(plan, workdir, proc, "local", run_id)
    write_state(deployment)
    return proc, deployment


def _wait_ready(
    proc: subprocess.Popen, deployment: TritonDeployment, plan: LaunchPlan, timeout: float, picked_ports: bool
) -> TritonDeployment:
    deadline = time.monotonic() + timeout
    try:
        with console.status(f"waiting for Triton (pid {proc.pid}) and {len(plan.models)} model(s) …"):
            while True:
                code = proc.poll()
                if code is not None:
                    if picked_ports and "already in use" in Path(plan.log).read_text(errors="replace"):
                        stop_server(deployment, grace_s=FAILED_START_GRACE_S, quiet=True)
                        raise _PortTaken()
                    failed = "; ".join(f"model {n}: {why}" for n, why in failed_models(plan.log).items())
                    problem = f"tritonserver exited with code {code} during start-up" + (f" ({failed})" if failed else "")
                    raise _fail(deployment, problem, f"see the log {plan.log}")
                if server_live(deployment.http_url):
                    ready = model_readiness(deployment.http_url, plan.models)
                    deployment.models = ready
                    if all(ready.values()):
                        health = stub_health(proc.pid, Path(plan.repository))  # the group leader: own session
                        if not health.healthy:  # Triton says ready even when a stub died while loading
                            raise _fail(deployment, "; ".join(health.problems()), f"see the log {plan.log}")
                        break
                if time.monotonic() > deadline:
                    waiting = [n for n, ok in deployment.models.items() if not ok] or ["(server not live)"]
                    raise _fail(
                        deployment,
                        f"not ready after {timeout:g}s (waiting for {', '.join(waiting)})",
                        f"raise deploy.ready_timeout_s or see the log {plan.log}",
                    )
                time.sleep(POLL_S)
    except BaseException as exc:
        if not isinstance(exc, (StepError, _PortTaken)):
            stop_server(deployment, grace_s=FAILED_START_GRACE_S, quiet=True)
        raise
    with deploy_lock(Path(deployment.workdir)):
        recorded = read_state(Path(deployment.workdir))
        if recorded is None or recorded.run_id != deployment.run_id or recorded.stopped_at or not is_our_server(deployment):
            raise StepError("deploy", f"the server (pid {deployment.pid}) was stopped while it started", "run `trtllm-forge deploy` again")
        deployment.running = True
        write_state(deployment)
    info(f"[green]✓[/green] deploy: Triton ready (pid {proc.pid}) grpc {deployment.grpc_url}  http {deployment.http_url}")
    return deployment


# ---- stop and status -------------------------------------------------------------------------------------


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


def _terminate(find: Callable[[], list[int]], pid: int | None, grace_s: float, quiet: bool, what: str) -> None:
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


def stop_group(pgid: int, pid: int | None, grace_s: float = STOP_GRACE_S, quiet: bool = False) -> None:
    """SIGTERM a server's whole process group, SIGKILL after the grace period (for servers started without a
    deployment record; a deployment's processes are stopped by stop_server, which checks they are ours)."""
    _terminate(lambda: group_members(pgid), pid, grace_s, quiet, f"process group {pgid}")


def stop_server(target: Path | TritonDeployment, *, grace_s: float = STOP_GRACE_S, quiet: bool = False) -> TritonDeployment | None:
    """SIGTERM the server and the python stubs of its process group, SIGKILL after the grace period; record
    the stop in state.json. Also stops the stubs a dead server left behind (only processes the deployment
    started: a recycled pid or group id is never signalled).

    Returns the updated deployment, or None when the workdir has no state.json.
    """
    deployment = target if isinstance(target, TritonDeployment) else read_state(Path(target))
    if deployment is None:
        return None
    with deploy_lock(Path(deployment.workdir)):
        if pid_alive(deployment.pid) and not is_our_server(deployment) and not quiet:
            info(f"pid {deployment.pid} now runs another program; not signalling it")
        _terminate(lambda: our_processes(deployment), deployment.pid, grace_s, True, f"the server (pid {deployment.pid})")
        child = _CHILDREN.pop(deployment.pid or -1, None)
        if child is not None:
            with suppress(subprocess.TimeoutExpired):
                child.wait(timeout=5)
        recorded = read_state(Path(deployment.workdir))
        if recorded is not None and recorded.run_id != deployment.run_id:
            return deployment  # a newer deployment was recorded since: leave its state alone
        deployment.running = False
        deployment.models = {name: False for name in deployment.models}
        deployment.stopped_at = _now()
        write_state(deployment)
    if not quiet:
        info(f"[green]✓[/green] deploy: stopped (pid {deployment.pid})")
    return deployment


def server_status(workdir: Path) -> TritonDeployment | None:
    """The recorded deployment with `running` and model readiness checked now; None when nothing was deployed."""
    deployment = read_state(Path(workdir))
    if deployment is None:
        return None
    alive = is_our_server(deployment)
    live = alive and server_live(deployment.http_url)
    deployment.running = bool(live)
    deployment.models = model_readiness(deployment.http_url, list(deployment.models)) if live else {n: False for n in deployment.models}
    if live:
        mark_dead_stubs(deployment)
    return deployment


def mark_dead_stubs(deployment: TritonDeployment) -> None:
    """Mark not ready the models whose python stubs died (Triton keeps saying they are ready)."""
    for model in stub_health(deployment.pgid or deployment.pid, Path(deployment.repository)).missing:
        deployment.models[model] = False


@contextmanager
def serving(config: ForgeConfig, workdir: Path, repository: Path | None = None, keep: bool = False) -> Iterator[TritonDeployment]:
    """A running server for the body of a `with` block; stopped on exit (errors and Ctrl-C too) unless keep.
    Unless keep, the server also dies when this process is killed with SIGKILL."""
    launched: list[TritonDeployment] = []
    started = False
    try:  # from before the start: a SIGTERM between "ready" and the body must still stop the server
        deployment = start_server(config, workdir, repository, die_with_caller=not keep, launched=launched.append)
        started = True
        yield deployment
    finally:
        if not keep and launched:
            stop_server(launched[-1], quiet=not started)
