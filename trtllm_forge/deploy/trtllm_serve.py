"""`trtllm-serve` as a deploy kind: TensorRT-LLM's OpenAI-compatible server on the llmapi target, for local,
docker and Kubernetes renderings; on CPU (engine.backend openvino) the same argv runs the LLM-API stand-in's
server (trtllm_forge.llmapi_cpu.serve, NOT TensorRT-LLM) so that `bench --target openai` measures it for real.

The command follows trtllm-serve's 1.2 CLI (NVIDIA/TensorRT-LLM:tensorrt_llm/commands/serve.py; flags listed in
/work/shared/reference/trtllm-build.md §10.2): `trtllm-serve MODEL --backend pytorch --host H --port P --tp_size N
--pp_size N [--ep_size N] --max_batch_size --max_num_tokens --max_seq_len --max_beam_width
--kv_cache_free_gpu_memory_fraction --extra_llm_api_options YAML`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import yaml

from trtllm_forge.config.schema import ForgeConfig
from trtllm_forge.errors import StepError

CONTAINER_PORT = 8000
STAND_IN_MODULE = "trtllm_forge.llmapi_cpu.serve"


def is_stand_in(config: ForgeConfig) -> bool:
    return config.engine.backend == "openvino"


def options_file(config: ForgeConfig, llmapi_dir: Path) -> Path:
    """The --extra_llm_api_options YAML: model.yaml's LLM() arguments without `model` and `triton_config`."""
    body = yaml.safe_load((llmapi_dir / "model.yaml").read_text()) or {}
    for key in ("model", "triton_config"):
        body.pop(key, None)
    path = llmapi_dir / "extra_llm_api_options.yaml"
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    return path


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
    if config.deploy.image:
        return config.deploy.image
    from trtllm_forge.builders.tensorrt_llm.spec import load_spec

    return load_spec(config.engine.trtllm_version).container_image


def docker_argv(config: ForgeConfig, model: str, options: str) -> list[str]:
    inside = serve_argv(config, model, options, host="0.0.0.0", port=CONTAINER_PORT)
    host_port = config.triton.http_port or ""
    gpus = config.deploy.resources.gpus if config.deploy.resources.gpus is not None else config.parallel.world_size
    argv = ["docker", "run", "--detach", "--name", _name(config), "--ipc=host", "--ulimit", "memlock=-1", "--ulimit", "stack=67108864",
            "--gpus", str(gpus), "-p", f"{config.triton.bind_address}:{host_port}:{CONTAINER_PORT}"]
    for path in sorted({str(Path(model)), str(Path(options).parent)}):
        argv += ["-v", f"{path}:{path}:ro"]
    return argv + [image_for(config), *inside]


def kubernetes_manifest(config: ForgeConfig, model: str, options: str) -> str:
    name = _name(config)
    labels = {"app.kubernetes.io/name": name, "app.kubernetes.io/managed-by": "trtllm-forge"}
    gpus = config.deploy.resources.gpus if config.deploy.resources.gpus is not None else config.parallel.world_size
    container = {
        "name": "trtllm-serve",
        "image": image_for(config),
        "command": serve_argv(config, model, options, host="0.0.0.0", port=CONTAINER_PORT),
        "ports": [{"name": "http", "containerPort": CONTAINER_PORT}],
        "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
        "readinessProbe": {"httpGet": {"path": "/health", "port": CONTAINER_PORT}, "periodSeconds": 10},
        "volumeMounts": [{"name": "model", "mountPath": str(Path(model))}, {"name": "options", "mountPath": str(Path(options).parent)}],
    }
    volumes = [{"name": "model", "hostPath": {"path": str(Path(model))}},
               {"name": "options", "hostPath": {"path": str(Path(options).parent)}}]
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "labels": labels},
                  "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                           "template": {"metadata": {"labels": labels},
                                        "spec": {"containers": [container], "volumes": volumes}}}}
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "labels": labels},
               "spec": {"selector": labels, "ports": [{"name": "http", "port": CONTAINER_PORT, "targetPort": CONTAINER_PORT}]}}
    return yaml.safe_dump_all([deployment, service], sort_keys=False)


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


def start_local(argv: list[str], url: str, log: Path, ready_timeout_s: float = 300.0) -> ServeProcess:
    """Start the server in its own process group, wait for /health, stop it (and raise) if it never gets there."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as handle:
        handle.write("$ " + " ".join(argv) + "\n")
        handle.flush()
        proc = subprocess.Popen(argv, stdout=handle, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
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
