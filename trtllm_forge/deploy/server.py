"""Start, watch and stop a Triton deployment; the Python API `run` and the tests use.

Where the server runs is its runner's business (`deploy/runner.py`: a process group here, `local_runner.py`, or a
container of the CPU image, `container_runner.py`); this module does what is the same for both: the deploy lock,
one server per workdir, the wait until the server is live and every model ready (through the ports clients use),
the log tail on a failed start, the record in state.json, the stop. Start and stop hold the workdir's deploy lock,
so two commands never launch two servers.
"""

from __future__ import annotations

import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from trtllm_forge.config import ForgeConfig
from trtllm_forge.deploy.container_runner import CONTAINER_RUNNER
from trtllm_forge.deploy.local_runner import LOCAL_RUNNER
from trtllm_forge.deploy.local_runner import stop_group as stop_group  # re-exported (scripts/bench_support)
from trtllm_forge.deploy.runner import PortTaken, Runner, ServerPlan, in_container
from trtllm_forge.deploy.state import TritonDeployment, deploy_lock, now, read_state, write_state
from trtllm_forge.errors import StepError
from trtllm_forge.ui import console, info

LOG_TAIL_LINES = 40
STOP_GRACE_S = 20.0
FAILED_START_GRACE_S = 5.0  # a server that failed to start has nothing worth a graceful shutdown
POLL_S = 0.25


def runner_for(config: ForgeConfig) -> Runner:
    """The runner a start of the config uses: a container for deploy.target docker and a CPU engine, else here."""
    return CONTAINER_RUNNER if in_container(config) else LOCAL_RUNNER


def recorded_runner(deployment: TritonDeployment) -> Runner:
    """The runner of a recorded deployment."""
    return CONTAINER_RUNNER if deployment.container else LOCAL_RUNNER


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


def _fail(runner: Runner, deployment: TritonDeployment, problem: str, valid: str) -> StepError:
    """Show the log tail, stop what is left, record the stop, and return the error to raise."""
    runner.save_log(deployment)
    tail = log_tail(Path(deployment.log))
    console.print(f"--- last lines of {deployment.log} ---", markup=False, highlight=False)
    console.print(tail, markup=False, highlight=False)
    console.print("--- end of log ---", markup=False, highlight=False)
    stop_server(deployment, grace_s=FAILED_START_GRACE_S, quiet=True)
    return StepError("deploy", problem, valid)


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
    """Start tritonserver on the repository where deploy.target says (`runner_for`) and wait until it is live and
    every model is ready.

    On any failure the server is stopped, the log tail is printed and a StepError is raised. Ports picked
    as free (configured 0) are picked again when another process takes one first. With die_with_caller a local
    server gets SIGKILL when this process dies, even by SIGKILL (for servers that live only as long as a
    command such as `run`; `deploy` leaves its server running). `launched` is told each deployment as soon
    as it exists, so a caller can stop it even when a signal interrupts the start.
    """
    workdir = Path(workdir).resolve()
    timeout = config.deploy.ready_timeout_s if ready_timeout_s is None else ready_timeout_s
    runner = runner_for(config)
    for attempt in range(1, PORT_ATTEMPTS + 1):
        try:
            with deploy_lock(workdir):
                _refuse_running_and_clear_leftovers(workdir)
                plan = runner.plan(config, workdir, repository)
                if attempt == 1:
                    runner.prepare(plan)
                deployment = runner.launch(plan, workdir, die_with_caller=die_with_caller)
                if launched is not None:
                    launched(deployment)
            return _wait_ready(runner, deployment, plan, timeout, picked_ports=0 in _configured_ports(config))
        except PortTaken:
            info(f"a port was taken before the server bound it; picking new ports (attempt {attempt + 1})")
    raise StepError("deploy", f"ports were taken by other processes {PORT_ATTEMPTS} times in a row", "set fixed triton ports")


def _refuse_running_and_clear_leftovers(workdir: Path) -> None:
    """With the deploy lock held: refuse a second server; stop what a dead earlier server left running."""
    previous = read_state(workdir)
    if previous is None:
        return
    runner = recorded_runner(previous)
    if runner.is_ours(previous):
        raise StepError(
            "deploy",
            f"a server from this workdir is already running ({previous.where}, grpc {previous.grpc_url})",
            f"stop it first: `trtllm-forge deploy stop --workdir {workdir}`",
        )
    leftovers = runner.leftovers(previous)
    if leftovers:
        info(f"stopping {len(leftovers)} process(es) the dead server (pid {previous.pid}) left running: {leftovers}")
    if leftovers or previous.container:
        stop_server(previous, grace_s=FAILED_START_GRACE_S, quiet=True)


def _configured_ports(config: ForgeConfig) -> list[int]:
    return [config.triton.http_port, config.triton.grpc_port, config.triton.metrics_port]


def _wait_ready(runner: Runner, deployment: TritonDeployment, plan: ServerPlan, timeout: float, picked_ports: bool) -> TritonDeployment:
    deadline = time.monotonic() + timeout
    where = deployment.where
    try:
        with console.status(f"waiting for Triton ({where}) and {len(plan.models)} model(s) …"):
            while True:
                code = runner.exit_code(deployment)
                if code is not None:
                    if picked_ports and runner.port_taken(deployment):
                        stop_server(deployment, grace_s=FAILED_START_GRACE_S, quiet=True)
                        raise PortTaken()
                    runner.save_log(deployment)
                    failed = "; ".join(f"model {n}: {why}" for n, why in failed_models(plan.log).items())
                    server = f"tritonserver in {where}" if deployment.container else "tritonserver"
                    problem = f"{server} exited with code {code} during start-up" + (f" ({failed})" if failed else "")
                    raise _fail(runner, deployment, problem, f"see the log {plan.log}")
                if server_live(deployment.http_url):
                    ready = model_readiness(deployment.http_url, plan.models)
                    deployment.models = ready
                    if all(ready.values()):
                        problems = runner.health(deployment)  # Triton says ready even when a stub died while loading
                        if problems:
                            raise _fail(runner, deployment, "; ".join(problems), f"see the log {plan.log}")
                        break
                if time.monotonic() > deadline:
                    waiting = [n for n, ok in deployment.models.items() if not ok] or ["(server not live)"]
                    raise _fail(
                        runner,
                        deployment,
                        f"not ready after {timeout:g}s (waiting for {', '.join(waiting)})",
                        f"raise deploy.ready_timeout_s or see the log {plan.log}",
                    )
                time.sleep(POLL_S)
    except BaseException as exc:
        if not isinstance(exc, (StepError, PortTaken)):
            stop_server(deployment, grace_s=FAILED_START_GRACE_S, quiet=True)
        raise
    with deploy_lock(Path(deployment.workdir)):
        recorded = read_state(Path(deployment.workdir))
        if recorded is None or recorded.run_id != deployment.run_id or recorded.stopped_at or not runner.is_ours(deployment):
            raise StepError("deploy", f"the server ({where}) was stopped while it started", "run `trtllm-forge deploy` again")
        deployment.running = True
        write_state(deployment)
    info(f"[green]✓[/green] deploy: Triton ready ({where}) grpc {deployment.grpc_url}  http {deployment.http_url}")
    return deployment


# ---- stop and status -------------------------------------------------------------------------------------


def stop_server(target: Path | TritonDeployment, *, grace_s: float = STOP_GRACE_S, quiet: bool = False) -> TritonDeployment | None:
    """Stop everything the deployment started (its runner's `terminate`: SIGTERM, SIGKILL after the grace
    period; a local server's python stubs too, a dead one's included, and never a recycled pid; a container
    with every other container of the workdir) and record the stop in state.json.

    Returns the updated deployment, or None when the workdir has no state.json.
    """
    deployment = target if isinstance(target, TritonDeployment) else read_state(Path(target))
    if deployment is None:
        return None
    with deploy_lock(Path(deployment.workdir)):
        recorded_runner(deployment).terminate(deployment, grace_s)
        recorded = read_state(Path(deployment.workdir))
        if recorded is not None and recorded.run_id != deployment.run_id:
            return deployment  # a newer deployment was recorded since: leave its state alone
        deployment.running = False
        deployment.models = {name: False for name in deployment.models}
        deployment.stopped_at = now()
        write_state(deployment)
    if not quiet:
        where = deployment.where
        info(f"[green]✓[/green] deploy: stopped ({where})")
    return deployment


def server_status(workdir: Path) -> TritonDeployment | None:
    """The recorded deployment with `running` and model readiness checked now; None when nothing was deployed."""
    deployment = read_state(Path(workdir))
    if deployment is None:
        return None
    runner = recorded_runner(deployment)
    live = runner.is_ours(deployment) and server_live(deployment.http_url)
    deployment.running = bool(live)
    deployment.models = model_readiness(deployment.http_url, list(deployment.models)) if live else {n: False for n in deployment.models}
    if live:
        for model in runner.dead_models(deployment):  # Triton keeps saying they are ready
            deployment.models[model] = False
    return deployment


@contextmanager
def serving(config: ForgeConfig, workdir: Path, repository: Path | None = None, keep: bool = False) -> Iterator[TritonDeployment]:
    """A running server for the body of a `with` block; stopped on exit (errors and Ctrl-C too) unless keep.
    Unless keep, a local server also dies when this process is killed with SIGKILL (a container does not: `deploy
    stop` or the next start removes it)."""
    launched: list[TritonDeployment] = []
    started = False
    try:  # from before the start: a SIGTERM between "ready" and the body must still stop the server
        deployment = start_server(config, workdir, repository, die_with_caller=not keep, launched=launched.append)
        started = True
        yield deployment
    finally:
        if not keep and launched:
            stop_server(launched[-1], quiet=not started)
