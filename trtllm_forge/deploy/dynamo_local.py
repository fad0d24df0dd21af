"""NVIDIA Dynamo on this host, on CPU (the `dynamo` server kind: deploy/kinds/dynamo.py): a frontend
(`python -m dynamo.frontend`, OpenAI's API, the router of deploy.dynamo.router_mode) and deploy.dynamo.workers
workers (deploy/dynamo_worker.py: our CPU engine loop behind Dynamo's Python worker API), all from Dynamo's own venv.

No etcd and no NATS: file discovery in `<workdir>/deploy/dynamo-discovery` (DYN_FILE_KV), requests over TCP, events
over ZMQ, everything on loopback (DYN_TCP_RPC_HOST, DYN_EVENT_PLANE_HOST, DYN_SYSTEM_HOST) on free ports. Every
process runs in its own group with the run mark; the record `<workdir>/deploy/dynamo.json` holds each one's pid and
argv, and a group is signalled only while its pid runs that argv. `deploy stop` removes the discovery folder too.

What the KV router knows of the workers' caches (`router_knowledge`, `router_flags`): by default the workers publish
KV events (dynamo_worker.py KvCacheRecord); deploy.dynamo.kv_events false runs the router's approximate mode. A
worker that dies with requests in flight: the frontend ends their streams with an error event (503; Dynamo's request
migration is off), answers 503 to a request it still routes there, then serves on the others.

Dynamo's venv: `make setup` makes `.venv-dynamo` beside the project (ai-dynamo's own pins, e.g. pydantic<=2.13.5,
conflict with ours); TRTLLM_FORGE_DYNAMO_PYTHON names another interpreter.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from trtllm_forge.config.schema import ForgeConfig
from trtllm_forge.errors import ConfigError, StepError

STATE = "dynamo.json"
DISCOVERY_DIR = "dynamo-discovery"
PYTHON_ENV = "TRTLLM_FORGE_DYNAMO_PYTHON"
VENV = ".venv-dynamo"  # the Makefile's DYNAMO_VENV
NAMESPACE = "forge"
STOP_GRACE_S = 15.0
ROLE_FRONTEND = "frontend"


def dynamo_python() -> Path:
    """The interpreter of Dynamo's venv; ConfigError saying how to make it when it is missing."""
    named = os.environ.get(PYTHON_ENV)
    python = Path(named) if named else Path(__file__).resolve().parents[2] / VENV / "bin" / "python"
    if not python.is_file():
        raise ConfigError(
            "deploy.server",
            f"dynamo needs NVIDIA Dynamo's venv and {python} does not exist",
            f"run `make setup` (it makes {VENV}) or set {PYTHON_ENV} to a Python with ai-dynamo 1.6.1 and openvino-genai",
        )
    return python


# Dynamo 1.6.1 reads DYN_SYSTEM_PORT as a signed 16-bit number: a port above 32767 (the kernel's ephemeral range
# starts at 32768) stops the worker at start ("expected i16 for key SYSTEM_PORT").
SYSTEM_PORT_RANGE = (10000, 32767)


def free_port(host: str, within: tuple[int, int] | None = None) -> int:
    """A port nothing listens on now: the kernel's choice, or a free one in `within` (inclusive)."""
    import random

    for _ in range(200):
        port = 0 if within is None else random.randint(*within)
        with socket.socket() as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return int(sock.getsockname()[1])
    raise StepError("deploy", f"no free port on {host} in {within}", "free some ports")


@dataclass
class DynamoProcess:
    """One process of the deployment: its role, argv, pid, log and the URL its readiness is asked at."""

    role: str  # frontend, worker-0, ...
    argv: list[str]
    env: dict[str, str]  # what it gets on top of the user's environment
    log: str
    url: str  # frontend: its OpenAI base URL; a worker: its system status server
    pid: int = 0

    def alive(self) -> bool:
        from trtllm_forge.processes import cmdline

        return self.pid > 0 and cmdline(self.pid) == self.argv

    def ready(self) -> bool:
        """frontend: /v1/models answers; worker: its status server says its generate endpoint is ready."""
        path = "/v1/models" if self.role == ROLE_FRONTEND else "/health"
        try:
            try:
                with urllib.request.urlopen(self.url + path, timeout=2) as response:
                    body = json.loads(response.read() or b"{}")
            except urllib.error.HTTPError as error:  # a worker's /health answers 503 with its endpoints' states
                body = json.loads(error.read() or b"{}")
        except (urllib.error.URLError, OSError, ValueError):
            return False
        if self.role == ROLE_FRONTEND:
            return bool(body.get("data"))
        endpoints = body.get("endpoints") or {}
        return bool(endpoints) and all(state == "ready" for state in endpoints.values())


@dataclass
class DynamoPlan:
    """Everything a local Dynamo deployment runs, before it runs."""

    model: str  # the served model id (/v1/models)
    discovery_dir: str
    frontend: DynamoProcess
    workers: list[DynamoProcess]

    @property
    def processes(self) -> list[DynamoProcess]:
        return [self.frontend, *self.workers]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> DynamoPlan:
        return cls(
            model=str(record["model"]),
            discovery_dir=str(record["discovery_dir"]),
            frontend=DynamoProcess(**record["frontend"]),
            workers=[DynamoProcess(**w) for w in record["workers"]],
        )


def served_name(config: ForgeConfig) -> str:
    return config.name or "model"


KV_EVENTS = "kv events"  # the workers publish what their engine's prefix cache stored and removed
APPROXIMATE = "approximate"  # the router assumes a routed request's blocks stay cached on its worker for a TTL
NOTHING = "nothing"  # round-robin or random routing, or no prefix caching: there is no cache to know about


def router_knowledge(config: ForgeConfig) -> str:
    """What the frontend's router knows about the workers' KV caches under this config: KV_EVENTS, APPROXIMATE or
    NOTHING."""
    dynamo = config.deploy.dynamo
    if dynamo.router_mode != "kv":
        return NOTHING
    if not dynamo.kv_events:
        return APPROXIMATE
    return KV_EVENTS if config.runtime.enable_kv_cache_reuse else NOTHING


def router_flags(config: ForgeConfig) -> list[str]:
    """The frontend's router flags (here and in the GPU renderings): its mode, in the approximate mode that it expects
    no KV events and how long it assumes a routed request's blocks stay cached, and the KV router's weight of prefill
    against running load."""
    dynamo = config.deploy.dynamo
    flags = ["--router-mode", dynamo.router_mode]
    if router_knowledge(config) == APPROXIMATE:
        flags += ["--no-router-kv-events", "--router-ttl-secs", f"{dynamo.approximate_ttl_s:g}"]
    if dynamo.router_mode == "kv":
        flags += ["--router-prefill-load-scale", f"{dynamo.prefill_load_scale:g}"]
    return flags


def _built(workdir: Path) -> tuple[Path, Path]:
    """(engine dir, Hugging Face model dir the frontend reads: config.json and tokenizer) from earlier stages."""
    from trtllm_forge.stage_results import BuildResult, ImportResult

    built, imported = BuildResult.in_workdir(workdir), ImportResult.in_workdir(workdir)
    if built is None or built.engine_dir is None or imported is None:
        raise ConfigError(
            "deploy.server",
            f"dynamo serves the CPU engine and {workdir} has no import and build",
            "run `trtllm-forge run CONFIG` (or import and build-engine) first",
        )
    model_dir = (
        imported.tokenizer_dir if imported.tokenizer_dir and (imported.tokenizer_dir / "config.json").is_file() else imported.checkpoint_dir
    )
    return built.engine_dir, model_dir


def plan(config: ForgeConfig, workdir: Path) -> DynamoPlan:
    """The frontend and worker commands for this config and workdir (ports chosen free now)."""
    if config.engine.backend != "openvino":
        raise ConfigError(
            "engine.backend",
            f"local Dynamo serves the OpenVINO CPU engine, not {config.engine.backend}",
            "set engine.backend: openvino, or render the GPU deployment with `deploy --target kubernetes`",
        )
    from trtllm_forge import model_repo_templates

    python = str(dynamo_python())
    engine_dir, model_dir = _built(workdir)
    host = config.triton.bind_address
    discovery = workdir / "deploy" / DISCOVERY_DIR
    logs = workdir / "logs"
    common = {
        "DYN_DISCOVERY_BACKEND": "file",
        "DYN_FILE_KV": str(discovery),
        "DYN_REQUEST_PLANE": "tcp",
        "DYN_TCP_RPC_HOST": host,
        "DYN_EVENT_PLANE_HOST": host,
        "DYN_SYSTEM_HOST": host,
        "HF_HUB_OFFLINE": "1",
    }
    port = config.triton.http_port or free_port(host)
    frontend_argv = [python, "-m", "dynamo.frontend", "--http-host", host, "--http-port", str(port)]
    frontend_argv += ["--discovery-backend", "file", *router_flags(config)]
    publish_kv_events = router_knowledge(config) == KV_EVENTS
    frontend = DynamoProcess(ROLE_FRONTEND, frontend_argv, common, str(logs / "dynamo-frontend.log"), f"http://{host}:{port}")
    runtime = config.runtime
    worker_argv = [python, str(Path(__file__).with_name("dynamo_worker.py"))]
    worker_argv += ["--engine-modules", str(Path(model_repo_templates.__file__).parent / "cpu" / "tensorrt_llm")]
    worker_argv += ["--engine-dir", str(engine_dir), "--model-dir", str(model_dir), "--model-name", served_name(config)]
    worker_argv += ["--endpoint", f"{NAMESPACE}.{served_name(config).replace('.', '-')}.generate"]
    if runtime.max_tokens_in_paged_kv_cache:
        worker_argv += ["--kv-tokens", str(runtime.max_tokens_in_paged_kv_cache)]
    if runtime.enable_kv_cache_reuse:
        worker_argv.append("--prefix-caching")
    if runtime.enable_chunked_context:
        worker_argv.append("--split-fuse")
    if publish_kv_events:
        worker_argv.append("--publish-kv-events")
    from trtllm_forge.model_repo_templates.cpu.tensorrt_llm.genai_settings import ARRIVAL_WINDOW_MS

    window = runtime.arrival_window_ms if runtime.arrival_window_ms is not None else ARRIVAL_WINDOW_MS
    worker_argv += ["--arrival-window-ms", str(window)]
    workers = []
    for index in range(config.deploy.dynamo.workers):
        system_port = free_port(host, SYSTEM_PORT_RANGE)
        env = {**common, "DYN_SYSTEM_PORT": str(system_port)}
        workers.append(
            DynamoProcess(f"worker-{index}", worker_argv, env, str(logs / f"dynamo-worker-{index}.log"), f"http://{host}:{system_port}")
        )
    return DynamoPlan(served_name(config), str(discovery), frontend, workers)


def _launch(process: DynamoProcess, run_id: str, *, die_with_caller: bool) -> subprocess.Popen[bytes]:
    from trtllm_forge import third_party_env
    from trtllm_forge.processes import RUN_MARK, spawn_in_session

    log = Path(process.log)
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as handle:
        handle.write("$ " + " ".join(f"{k}={v}" for k, v in process.env.items()) + " " + " ".join(process.argv) + "\n")
        handle.flush()
        child = spawn_in_session(
            process.argv, handle, env={**third_party_env(), **process.env, RUN_MARK: run_id}, die_with_caller=die_with_caller
        )
    process.pid = child.pid
    return child


def _wait_ready(processes: list[DynamoProcess], children: dict[str, subprocess.Popen[bytes]], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    waiting = list(processes)
    while waiting:
        for process in list(waiting):
            child = children.get(process.role)
            if child is not None and child.poll() is not None:
                raise StepError("deploy", f"dynamo {process.role} exited with {child.returncode} before it was ready", f"see {process.log}")
            if process.ready():
                waiting.remove(process)
        if waiting and time.monotonic() > deadline:
            names = ", ".join(p.role for p in waiting)
            raise StepError("deploy", f"dynamo {names} not ready within {timeout_s:g}s", f"see {waiting[0].log}")
        time.sleep(0.3)


def _write(workdir: Path, deployment: DynamoPlan) -> None:
    from trtllm_forge.stages import write_json_atomic

    write_json_atomic(workdir / "deploy" / STATE, deployment.to_dict())


def recorded(workdir: Path) -> DynamoPlan | None:
    try:
        return DynamoPlan.from_dict(json.loads((workdir / "deploy" / STATE).read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def start(config: ForgeConfig, workdir: Path, ready_timeout_s: float | None = None, *, die_with_caller: bool = False) -> DynamoPlan:
    """Start the frontend and the workers, wait until each is ready, record them. With a deployment of this workdir
    whose frontend still runs, only its dead workers are started again (the others keep serving)."""
    from trtllm_forge.processes import new_run_id

    timeout = config.deploy.ready_timeout_s if ready_timeout_s is None else ready_timeout_s
    previous = recorded(workdir)
    if previous is not None and previous.frontend.alive():
        dead = [w for w in previous.workers if not w.alive()]
        if not dead:
            raise StepError(
                "deploy",
                f"a dynamo deployment from this workdir is already running ({previous.frontend.url}, {len(previous.workers)} workers)",
                f"stop it first: `trtllm-forge deploy stop --workdir {workdir}`",
            )
        run_id = new_run_id()
        restarted = {w.role: _launch(w, run_id, die_with_caller=die_with_caller) for w in dead}
        _write(workdir, previous)
        _wait_ready(dead, restarted, timeout)
        return previous
    if previous is not None:
        stop(workdir)  # a dead frontend: start everything afresh
    deployment = plan(config, workdir)
    shutil.rmtree(deployment.discovery_dir, ignore_errors=True)
    Path(deployment.discovery_dir).mkdir(parents=True, exist_ok=True)
    run_id = new_run_id()
    children: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for process in deployment.processes:
            children[process.role] = _launch(process, run_id, die_with_caller=die_with_caller)
        _write(workdir, deployment)
        _wait_ready(deployment.processes, children, timeout)
    except BaseException:
        stop(workdir)
        raise
    return deployment


def stop(workdir: Path, grace_s: float = STOP_GRACE_S) -> DynamoPlan | None:
    """Stop every recorded process (workers first: they remove their discovery entries), then remove the discovery
    folder and the record; None when nothing is recorded."""
    import contextlib
    import functools

    from trtllm_forge.processes import group_members, terminate

    deployment = recorded(workdir)
    if deployment is None:
        return None
    survivors: list[int] = []
    for process in [*deployment.workers, deployment.frontend]:
        if process.alive():  # a recycled pid running another program is never signalled
            survivors += terminate(functools.partial(group_members, process.pid), grace_s)
        with contextlib.suppress(ChildProcessError):  # started by this process (`run`): reap it
            os.waitpid(process.pid, os.WNOHANG)
    if survivors:
        raise StepError("deploy stop", f"dynamo processes {survivors} survived SIGKILL", "check them with ps")
    shutil.rmtree(deployment.discovery_dir, ignore_errors=True)
    (workdir / "deploy" / STATE).unlink(missing_ok=True)
    return deployment
