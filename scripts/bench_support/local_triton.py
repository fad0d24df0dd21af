"""A Triton server for the benchmark's own tests and fidelity script: the timing model in a temp repository,
served by the tritonserver deploy would use (`find_tritonserver`), bound to 127.0.0.1.

Deployments of real models go through `trtllm_forge.deploy`; this exists so the benchmark can be checked
against a server whose token schedule is known. Discovery, the backend directory, the environment, ports,
readiness, stop and the argv (deploy/server_argv.py) are deploy's; it keeps no state.json and no model table.
"""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import jinja2

from trtllm_forge import third_party_env
from trtllm_forge.deploy.discovery import find_tritonserver, prepare_backend_dir, server_environment
from trtllm_forge.deploy.launch import free_port
from trtllm_forge.deploy.server import server_ready, stop_group
from trtllm_forge.deploy.server_argv import PORT_NAMES, tritonserver_argv
from trtllm_forge.deploy.state import ServerUrls
from trtllm_forge.errors import StepError
from trtllm_forge.processes import dying_with_parent
from trtllm_forge.render.stub_env import project_env

TIMING_MODEL_DIR = Path(__file__).parent / "timing_model"
HOST = "127.0.0.1"


def render_timing_model(
    repository: Path,
    name: str = "ensemble",
    ttft_ms: float = 20.0,
    gap_ms: float = 10.0,
    max_batch_size: int = 256,
    contract: str = "text",
    instances: int = 1,
) -> Path:
    """Write the timing model as `<repository>/<name>/` and return its directory.

    contract "text" is the ensemble's (text_input/max_tokens → text_output); "tokens" is the tensorrt_llm
    model's (input_ids/request_output_len → output_ids)."""
    model_dir = repository / name
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    (model_dir / "1" / "model.py").write_text((TIMING_MODEL_DIR / "model.py").read_text())
    template = jinja2.Template(
        (TIMING_MODEL_DIR / ("config_tokens.pbtxt" if contract == "tokens" else "config.pbtxt")).read_text(),
        undefined=jinja2.StrictUndefined,
    )
    (model_dir / "config.pbtxt").write_text(
        template.render(
            name=name,
            ttft_ms=ttft_ms,
            gap_ms=gap_ms,
            max_batch_size=max_batch_size,
            env_path=project_env(),
            instances=instances,
        )
    )
    return model_dir


@dataclass
class LocalTriton(ServerUrls):
    process: subprocess.Popen
    ports: dict[str, int]
    log_path: Path
    host: str = HOST

    def stop(self, timeout: float = 20.0) -> None:
        """Stop the server with its python stubs (it leads its own process group) and reap it."""
        stop_group(self.process.pid, self.process.pid, grace_s=timeout, quiet=True)
        self.process.wait()


def server_argv(binary: Path, repository: Path, ports: dict[str, int], backend_dir: Path | None) -> list[str]:
    """The deploy's flags, bound to 127.0.0.1."""
    return tritonserver_argv(binary, repository, ports, HOST, backend_dir=backend_dir)


def start_triton(repository: Path, workdir: Path, ready_timeout: float = 120.0, ports: dict[str, int] | None = None) -> LocalTriton:
    """tritonserver on `repository`, on free ports (or `ports`: a server started again where clients know it)."""
    install = find_tritonserver()
    backends = prepare_backend_dir(install, workdir / "backends")
    if ports is None:
        ports = {}
        for name in PORT_NAMES:
            ports[name] = free_port(HOST, set(ports.values()))
    argv = server_argv(install.binary, repository, ports, backends)
    log_path = workdir / "tritonserver.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**third_party_env(), **server_environment(install)},
            start_new_session=True,
            preexec_fn=dying_with_parent(new_group=False),  # a bench or test killed outright takes its server along
        )
    server = LocalTriton(process, ports, log_path)
    deadline = time.monotonic() + ready_timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            server.stop()
            raise StepError("tritonserver", f"exited with {process.returncode} before it was ready", f"see {log_path}")
        if server_ready(server.http_url):
            return server
        time.sleep(0.2)
    server.stop()
    raise StepError("tritonserver", f"not ready after {ready_timeout:.0f} s", f"see {log_path}")
