"""A Triton server for the benchmark's own tests and fidelity script: the timing model in a temp repository,
served by the tritonserver that ships inside the nvidia-pytriton wheel, bound to 127.0.0.1.

Deployments of real models go through `trtllm_forge.deploy`; this exists so the benchmark can be checked
against a server whose token schedule is known.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import jinja2

from trtllm_forge.errors import StepError
from trtllm_forge.render.stub_env import project_env

TIMING_MODEL_DIR = Path(__file__).parent / "timing_model"


def render_timing_model(repository: Path, name: str = "ensemble", ttft_ms: float = 20.0, gap_ms: float = 10.0,
                        max_batch_size: int = 256, contract: str = "text", instances: int = 1) -> Path:
    """Write the timing model as `<repository>/<name>/` and return its directory.

    contract "text" is the ensemble's (text_input/max_tokens → text_output); "tokens" is the tensorrt_llm
    model's (input_ids/request_output_len → output_ids)."""
    model_dir = repository / name
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    (model_dir / "1" / "model.py").write_text((TIMING_MODEL_DIR / "model.py").read_text())
    template = jinja2.Template((TIMING_MODEL_DIR / ("config_tokens.pbtxt" if contract == "tokens" else "config.pbtxt")).read_text(), undefined=jinja2.StrictUndefined)
    (model_dir / "config.pbtxt").write_text(template.render(
        name=name, ttft_ms=ttft_ms, gap_ms=gap_ms, max_batch_size=max_batch_size, env_path=project_env(), instances=instances,
    ))
    return model_dir


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _pytriton_root() -> Path:
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise StepError("tritonserver", "the nvidia-pytriton wheel is not installed", "pip install --no-deps nvidia-pytriton==0.7.0")
    return Path(spec.submodule_search_locations[0])


def backend_directory(dest: Path) -> Path:
    """A backend directory holding the python backend with the stub for the running Python."""
    root = _pytriton_root() / "tritonserver"
    python_dir = dest / "python"
    python_dir.mkdir(parents=True, exist_ok=True)
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    for source in (root / "backends/python/libtriton_python.so", root / "backends/python/triton_python_backend_utils.py",
                   root / f"python_backend_stubs/{version}/triton_python_backend_stub"):
        link = python_dir / source.name
        if not link.exists():
            link.symlink_to(source)
    return dest


@dataclass
class LocalTriton:
    process: subprocess.Popen
    http_port: int
    grpc_port: int
    metrics_port: int
    log_path: Path

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def stop(self, timeout: float = 20.0) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_triton(repository: Path, workdir: Path, ready_timeout: float = 120.0) -> LocalTriton:
    root = _pytriton_root()
    libs = root.parent / "nvidia_pytriton.libs"
    ports = [free_port() for _ in range(3)]
    argv = [
        str(root / "tritonserver/bin/tritonserver"),
        f"--model-repository={repository}",
        f"--backend-directory={backend_directory(workdir / 'backends')}",
        "--http-address=127.0.0.1", f"--http-port={ports[0]}",
        "--grpc-address=127.0.0.1", f"--grpc-port={ports[1]}",
        "--metrics-address=127.0.0.1", f"--metrics-port={ports[2]}",
        "--allow-cpu-metrics=false", "--allow-gpu-metrics=false", "--log-verbose=0", "--exit-timeout-secs=3",
    ]
    env = {**os.environ, "LD_LIBRARY_PATH": f"{libs}:{os.environ.get('LD_LIBRARY_PATH', '')}"}
    log_path = workdir / "tritonserver.log"
    log = open(log_path, "wb")  # noqa: SIM115 - kept open for the server's lifetime
    process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    server = LocalTriton(process, *ports, log_path)
    deadline = time.monotonic() + ready_timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise StepError("tritonserver", f"exited with {process.returncode} before it was ready", f"see {log_path}")
        try:
            with urllib.request.urlopen(f"{server.http_url}/v2/health/ready", timeout=1) as response:
                if response.status == 200:
                    return server
        except OSError:
            pass
        time.sleep(0.2)
    server.stop()
    raise StepError("tritonserver", f"not ready after {ready_timeout:.0f} s", f"see {log_path}")
