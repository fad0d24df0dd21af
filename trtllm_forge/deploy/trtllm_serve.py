"""What runs `trtllm-serve` (the kind itself: `deploy/kinds/trtllm_serve.py`): TensorRT-LLM's OpenAI-compatible
server on the llmapi target, its command, its docker and Kubernetes renderings, its local process and record. On
CPU (engine.backend openvino) the same argv runs the LLM-API stand-in's server (trtllm_forge.llmapi_cpu.serve, NOT
TensorRT-LLM) so that `bench --target openai` measures it for real.

The command follows trtllm-serve's 1.2 CLI (NVIDIA/TensorRT-LLM:tensorrt_llm/commands/serve.py; flags listed in
/work/shared/reference/trtllm-build.md §10.2): `trtllm-serve MODEL --backend pytorch --host H --port P --tp_size N
--pp_size N [--ep_size N] --max_batch_size --max_num_tokens --max_seq_len --max_beam_width
--kv_cache_free_gpu_memory_fraction --extra_llm_api_options YAML`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from trtllm_forge.config.schema import ForgeConfig
from trtllm_forge.errors import StepError

CONTAINER_PORT = 8000
STAND_IN_MODULE = "trtllm_forge.llmapi_cpu.serve"


def is_stand_in(config: ForgeConfig) -> bool:
    return config.engine.backend == "openvino"


def serve_argv(config: ForgeConfig, model: str, options: str, *, host: str | None = None, port: int | None = None) -> list[str]:
    """The exact trtllm-serve command (on CPU: the stand-in's server with the same flags)."""
    from trtllm_forge.builders.tensorrt_llm.llmapi import serve_argv as trtllm_serve_argv

    argv = trtllm_serve_argv(config, model, options)
    if host is not None:
        argv[argv.index("--host") + 1] = host
    if port is not None:
        argv[argv.index("--port") + 1] = str(port)
    return [sys.executable, "-m", STAND_IN_MODULE, *argv[1:]] if is_stand_in(config) else argv


def _name(config: ForgeConfig) -> str:
    import re

    return "trtllm-serve-" + re.sub(r"[^a-z0-9-]+", "-", (config.name or "default").lower()).strip("-")


def image_for(config: ForgeConfig) -> str:
    from trtllm_forge.builders.tensorrt_llm.images import llmapi_serving_image

    return llmapi_serving_image(config.deploy.image, served_llmapi_version(config), multi_node=config.parallel.nodes > 1)


def served_llmapi_version(config: ForgeConfig) -> str:
    from trtllm_forge.llmapi_args import table_of

    return table_of(config.engine.llmapi_version, config.deploy.server).version


def docker_argv(config: ForgeConfig, model: str, options: str) -> list[str]:
    from trtllm_forge.builders.tensorrt_llm.images import GPU_CONTAINER_FLAGS

    inside = serve_argv(config, model, options, host="0.0.0.0", port=CONTAINER_PORT)
    host_port = config.triton.http_port or ""
    gpus = config.deploy.resources.gpus if config.deploy.resources.gpus is not None else config.parallel.world_size
    argv = [
        "docker",
        "run",
        "--detach",
        "--name",
        _name(config),
        *GPU_CONTAINER_FLAGS,
        "--gpus",
        str(gpus),
        "-p",
        f"{config.triton.bind_address}:{host_port}:{CONTAINER_PORT}",
    ]
    for path in sorted({str(Path(model)), str(Path(options).parent)}):
        argv += ["-v", f"{path}:{path}:ro"]
    return [*argv, image_for(config), *inside]


LLMAPI_LAUNCH = "trtllm-llmapi-launch"  # TensorRT-LLM's multi-node launcher of LLM-API programs (rank 0 serves)


def served_paths(config: ForgeConfig, model: str, options: str) -> list[Path]:
    """What a trtllm-serve pod reads: the checkpoint, the options file's folder, the tokenizer, the draft model
    (speculative decoding) and the custom plugin libraries."""
    paths = [Path(model), Path(options).parent]
    for value in (config.model.tokenizer, config.engine.speculative.draft_model):
        if value:
            paths.append(config.resolve_path(value))
    return paths + [config.resolve_path(p) for p in config.engine.plugins.custom_libraries]


def kubernetes_documents(config: ForgeConfig, model: str, options: str) -> list[dict[str, Any]]:
    """One node: PersistentVolumeClaim, Deployment and Service. parallel.nodes > 1: NVIDIA's multi-node LLM-API
    launch (NVIDIA/TensorRT-LLM@0bd8871:examples/llm-api/llm_mgmn_trtllm_serve.sh: one MPI process per GPU, each
    running `trtllm-llmapi-launch trtllm-serve ...`; rank 0 serves, the others are its workers) with `mpirun` over a
    LeaderWorkerSet (deploy/kubernetes.py)."""
    from trtllm_forge.deploy import kubernetes

    name = kubernetes.app_name(config, "trtllm-serve")
    argv = serve_argv(config, model, options, host="0.0.0.0", port=CONTAINER_PORT)
    libraries = config.engine.plugins.custom_libraries
    pod = kubernetes.ServerPod(
        container="trtllm-serve",
        image=image_for(config),
        command=argv,
        gpus=config.deploy.resources.gpus if config.deploy.resources.gpus is not None else config.parallel.world_size,
        paths=served_paths(config, model, options),
        env={"LD_PRELOAD": ":".join(str(config.resolve_path(p)) for p in libraries)} if libraries else {},
        ports={"http": CONTAINER_PORT},
        probes=kubernetes.Probes(ready="/health", live="/health"),
    )
    if config.parallel.nodes <= 1:
        return kubernetes.single_node(config, name, pod)
    return kubernetes.multi_node(config, name, pod, ["-np", str(config.parallel.world_size), LLMAPI_LAUNCH, *argv])


def kubernetes_manifest(config: ForgeConfig, model: str, options: str) -> str:
    from trtllm_forge.deploy.kubernetes import dump_all

    return dump_all(kubernetes_documents(config, model, options))


@dataclass
class ServeProcess:
    """A local trtllm-serve (or stand-in) process: its URL, pid and log."""

    url: str
    pid: int
    log: Path
    argv: list[str]
    process: subprocess.Popen | None = None

    def stop(self, timeout: float = 30.0) -> None:
        try:
            os.killpg(self.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        if self.process is not None:
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.pid, signal.SIGKILL)
                self.process.wait(10)


def start_local(argv: list[str], url: str, log: Path, ready_timeout_s: float = 300.0, *, die_with_caller: bool = False) -> ServeProcess:
    """Start the server in its own process group, wait for /health, stop it (and raise) if it never gets there.
    With die_with_caller it gets SIGKILL when this process dies (servers that live only as long as `run`)."""
    from trtllm_forge.processes import spawn_in_session

    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as handle:
        handle.write("$ " + shlex.join(argv) + "\n")
        handle.flush()
        proc = spawn_in_session(argv, handle, die_with_caller=die_with_caller)
    server = ServeProcess(url, proc.pid, log, argv, proc)
    deadline = time.monotonic() + ready_timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise StepError("deploy", f"trtllm-serve exited with {proc.returncode} before it was ready", f"see {log}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
                if response.status == 200:
                    return server
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)
    server.stop()
    raise StepError("deploy", f"trtllm-serve was not healthy within {ready_timeout_s:g}s", f"see {log}")


STATE = "trtllm-serve.json"
LOG = "trtllm-serve.log"
STOP_GRACE_S = 30.0  # between SIGTERM and SIGKILL of the server's process group


def _built(workdir: Path) -> tuple[str, Path]:
    """(model path, --extra_llm_api_options file) from the build stage's model.yaml."""
    from trtllm_forge.errors import ConfigError
    from trtllm_forge.stage_results import BuildResult

    built = BuildResult.in_workdir(workdir)
    if built is None or built.model_yaml is None or built.llmapi_dir is None or not built.model_yaml.is_file():
        raise ConfigError(
            "deploy.server",
            f"trtllm-serve serves the llmapi build and {workdir / 'build'} has none",
            "set engine.target: llmapi and run `trtllm-forge build-engine CONFIG` first",
        )
    model = (yaml.safe_load(built.model_yaml.read_text()) or {}).get("model")
    return built.moved_here(str(model)), options_file_for(built.llmapi_dir)


def options_file_for(llmapi_dir: Path) -> Path:
    existing = llmapi_dir / "extra_llm_api_options.yaml"
    if existing.is_file():
        return existing
    body = yaml.safe_load((llmapi_dir / "model.yaml").read_text()) or {}
    for key in ("model", "triton_config"):
        body.pop(key, None)
    existing.write_text(yaml.safe_dump(body, sort_keys=False))
    return existing


def planned(config: ForgeConfig, workdir: Path) -> tuple[str, Path]:
    """(model path, options file) the TensorRT-LLM llmapi build will record, for a rendering before the build."""
    from trtllm_forge.builders.tensorrt_llm.plan import LLMAPI_DIR, model_source

    return str(model_source(config, None)), workdir / "build" / LLMAPI_DIR / "extra_llm_api_options.yaml"


def rendering(config: ForgeConfig, workdir: Path, target: str) -> tuple[Path, str]:
    """(file, text) of the docker (a `docker run` script) or kubernetes rendering; before the llmapi build, of the
    paths the build will write (the same ones, so the rendering does not change once it has run)."""
    from trtllm_forge.stage_results import BuildResult

    built = BuildResult.in_workdir(workdir)
    unbuilt = (built is None or built.model_yaml is None) and not is_stand_in(config)
    model, options = planned(config, workdir) if unbuilt else _built(workdir)
    out = workdir / "deploy"
    if target == "docker":
        return out / "trtllm-serve-docker.sh", "#!/bin/sh\nexec " + shlex.join(docker_argv(config, model, str(options))) + "\n"
    return out / "trtllm-serve.yaml", kubernetes_manifest(config, model, str(options))


def local_command(config: ForgeConfig, workdir: Path) -> tuple[list[str], str]:
    """(argv, url) of a local start: on triton.http_port, or a free port when it is 0."""
    import socket

    model, options = _built(workdir)
    host, port = config.triton.bind_address, config.triton.http_port
    if not port:
        with socket.socket() as sock:
            sock.bind((host, 0))
            port = sock.getsockname()[1]
    return serve_argv(config, model, str(options), host=host, port=port), f"http://{host}:{port}"


def start_recorded(
    config: ForgeConfig, workdir: Path, ready_timeout_s: float | None = None, *, die_with_caller: bool = False
) -> dict[str, Any]:
    """Start it here, wait for /health, and record it in <workdir>/deploy/trtllm-serve.json (argv, url, pid, log,
    stand_in); refused while the one recorded there runs."""
    refuse_running(workdir)
    argv, url = local_command(config, workdir)
    timeout = config.deploy.ready_timeout_s if ready_timeout_s is None else ready_timeout_s
    server = start_local(argv, url, workdir / "logs" / LOG, timeout, die_with_caller=die_with_caller)
    described = {"argv": argv, "url": url, "stand_in": is_stand_in(config), "pid": server.pid, "log": str(server.log)}
    from trtllm_forge.stages import write_json_atomic

    write_json_atomic(workdir / "deploy" / STATE, described)
    return described


def refuse_running(workdir: Path) -> None:
    """StepError when the trtllm-serve recorded in the workdir still runs (one server per workdir)."""
    previous = recorded(workdir)
    if previous is not None and is_running(previous):
        raise StepError(
            "deploy",
            f"a trtllm-serve from this workdir is already running (pid {previous['pid']}, {previous['url']})",
            f"stop it first: `trtllm-forge deploy stop --workdir {workdir}`",
        )


def stop(workdir: Path, grace_s: float = STOP_GRACE_S) -> dict[str, Any] | None:
    """Stop the local trtllm-serve recorded in <workdir>/deploy/trtllm-serve.json (its whole process group) and
    remove the record; None when none is recorded."""
    path = workdir / "deploy" / STATE
    state = recorded(workdir)
    if state is None:
        return None
    from trtllm_forge.processes import group_members, terminate

    pid = int(state["pid"])
    if is_running(state):  # a recycled pid running another program is never signalled
        survivors = terminate(lambda: group_members(pid), grace_s)
        if survivors:
            raise StepError("deploy stop", f"trtllm-serve processes {survivors} survived SIGKILL", "check them with ps")
    with contextlib.suppress(ChildProcessError):  # started by this process (`run`): reap it, or it stays a zombie
        os.waitpid(pid, os.WNOHANG)
    path.unlink(missing_ok=True)
    return state


def is_running(state: dict[str, Any]) -> bool:
    """The recorded server's pid still runs the recorded command."""
    from trtllm_forge.processes import cmdline

    return cmdline(int(state["pid"])) == list(state["argv"])


def is_healthy(url: str) -> bool:
    """trtllm-serve's /health answers 200."""
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False


def recorded(workdir: Path) -> dict[str, Any] | None:
    """What <workdir>/deploy/trtllm-serve.json records (None: nothing, or a file that is not a record)."""
    path = workdir / "deploy" / STATE
    try:
        state = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return state if isinstance(state, dict) and {"pid", "argv", "url"} <= state.keys() else None


def served_url(workdir: Path) -> str | None:
    state = recorded(workdir)
    return str(state["url"]) if state else None


def model_of(argv: list[str]) -> str:
    """trtllm-serve names the model by the path it was given (its /v1/models id): the argument before --backend."""
    return argv[argv.index("--backend") - 1]


def served_model(workdir: Path) -> str | None:
    state = recorded(workdir)
    return model_of(list(state["argv"])) if state else None
