"""deploy against a real tritonserver (the nvidia-pytriton wheel's) on tiny python-backend repositories."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from cli_inprocess import run_in_process
from conftest import forge_test_config, run_cli, write_tiny_repository

pytestmark = pytest.mark.slow

CONFIG = """name: deploy-real
model: {source: smollm2-135m}
engine: {backend: openvino}
triton: {http_port: 0, grpc_port: 0, metrics_port: 0}
deploy: {ready_timeout_s: 60}
"""

# A model that reports what the python stub's interpreter sees: NumPy version and whether this venv's packages
# (openvino_genai, which the CPU engine model needs) are importable.
_PROBE_CONFIG = """backend: "python"
max_batch_size: 0
input [ { name: "INPUT" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_STRING dims: [ 2 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""
_PROBE_MODEL = """import importlib.util
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        found = importlib.util.find_spec("openvino_genai") is not None
        facts = np.array([np.__version__.encode(), str(found).encode()], dtype=np.object_)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", facts)]) for _ in requests]
"""
_SLOW_MODEL = """import time


class TritonPythonModel:
    def initialize(self, args):
        time.sleep(60)

    def execute(self, requests):
        return []
"""


def group_alive(pgid: int) -> list[int]:
    from trtllm_forge.processes import group_members

    return group_members(pgid)


def listening_addresses(port: int) -> set[str]:
    """Local addresses with a socket in LISTEN state on `port` (from /proc/net/tcp and tcp6)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.split(":")
            if state == "0A" and int(hex_port, 16) == port:
                found.add(address)
    return found


LOOPBACK = {"0100007F", "0000000000000000FFFF00000100007F"}  # 127.0.0.1 and ::ffff:127.0.0.1


@pytest.fixture(scope="module")
def served(tmp_path_factory, write_config_module):
    """The CLI form: `deploy CONFIG` on a tiny repository; stopped by the test at the end, or here on failure."""
    repo = write_tiny_repository(tmp_path_factory.mktemp("repo"))
    (repo / "probe" / "1").mkdir(parents=True)
    (repo / "probe" / "config.pbtxt").write_text(_PROBE_CONFIG)
    (repo / "probe" / "1" / "model.py").write_text(_PROBE_MODEL)
    workdir = tmp_path_factory.mktemp("wd")
    config = write_config_module(CONFIG)
    result = run_cli("deploy", str(config), "--workdir", str(workdir), "--repository", str(repo), "--json")
    yield config, workdir, result
    run_in_process("deploy", "stop", "--workdir", str(workdir))


@pytest.fixture(scope="module")
def write_config_module(tmp_path_factory):
    def _write(text: str) -> Path:
        path = tmp_path_factory.mktemp("cfg") / "deploy.yaml"
        path.write_text(text)
        return path

    return _write


def test_start_status_request_stop(served):
    from trtllm_forge.client import generate, stream_request

    config, workdir, started = served
    assert started.returncode == 0, started.stderr
    state = json.loads(started.stdout)
    assert state["running"] is True
    assert state["models"] == {"echo": True, "probe": True, "words": True}
    assert json.loads((workdir / "deploy" / "state.json").read_text())["pid"] == state["pid"]
    assert group_alive(state["pgid"])

    status = run_in_process("deploy", "status", str(config), "--workdir", str(workdir), "--json")
    assert status.returncode == 0, status.stderr
    live = json.loads(status.stdout)
    for key in ("running", "pid", "grpc_url", "http_url", "metrics_url", "models"):
        assert key in live
    assert live["running"] is True and all(live["models"].values())
    assert live["grpc_url"] == f"127.0.0.1:{state['ports']['grpc']}"

    again = run_cli("deploy", str(config), "--workdir", str(workdir), "--repository", state["repository"])
    assert again.returncode == 1
    assert "error: deploy: a server from this workdir is already running" in again.stderr

    # Requests through the shared client helper, over gRPC streams.
    streamed = generate(workdir, "one two three four five", 4, stream=True, model="words")
    whole = generate(workdir, "one two three four five", 4, stream=False, model="words")
    assert streamed.chunks == ["one ", "two ", "three ", "four "]
    assert streamed.text == whole.text == "one two three four "
    assert len(whole.chunks) == 1 and streamed.ttft_s is not None and streamed.ttft_s <= streamed.total_s
    echoed = stream_request(workdir, "echo", {"INPUT": ["héllo", "wörld"]})
    assert [v.decode() for v in echoed.responses[0]["OUTPUT"]] == ["héllo", "wörld"]
    numpy_version, has_genai = (v.decode() for v in stream_request(workdir, "probe", {"INPUT": ["?"]}).responses[0]["OUTPUT"])
    assert numpy_version.startswith("1."), "the wheel's stub needs NumPy 1.x"
    assert has_genai == "True", "the stub must import this venv's packages"

    with urllib.request.urlopen(live["metrics_url"], timeout=5) as response:
        assert 'nv_inference_request_success{model="words"' in response.read().decode()

    # Loopback only: every listening socket of the three ports is bound to 127.0.0.1.
    for port in state["ports"].values():
        addresses = listening_addresses(port)
        assert addresses and addresses <= LOOPBACK, f"port {port} listens on {addresses}"

    from trtllm_forge.deploy.local_runner import _stub_shm_regions

    regions = _stub_shm_regions(group_alive(state["pgid"]))
    assert len(regions) == 3  # one python stub per model instance
    stop = run_in_process("deploy", "stop", str(config), "--workdir", str(workdir))
    assert stop.returncode == 0, stop.stderr
    assert not group_alive(state["pgid"]), "processes left behind after deploy stop"
    assert not [r for r in regions if r.exists()], "shared-memory regions left behind"
    after = json.loads(run_in_process("deploy", "status", "--workdir", str(workdir), "--json").stdout)
    assert after["running"] is False and not any(after["models"].values())


def test_broken_model_fails_with_log_tail_and_leaves_nothing(tmp_path, write_config):
    repo = write_tiny_repository(tmp_path / "repo", broken=True)
    workdir = tmp_path / "wd"
    result = run_cli("deploy", str(write_config(CONFIG)), "--workdir", str(workdir), "--repository", str(repo))
    assert result.returncode == 1
    assert "forge-test: this model refuses to load" in result.stderr  # from the server log's tail
    assert "error: deploy: tritonserver exited with code 1 during start-up (model broken: " in result.stderr
    assert "Traceback (most recent call last)" not in result.stderr.split("--- end of log ---")[-1]
    state = json.loads((workdir / "deploy" / "state.json").read_text())
    assert state["running"] is False
    assert not group_alive(state["pgid"])


def _slow_repository(repo: Path) -> Path:
    """A repository whose one model takes long to load (_SLOW_MODEL)."""
    (repo / "slow" / "1").mkdir(parents=True)
    (repo / "slow" / "config.pbtxt").write_text(_PROBE_CONFIG)
    (repo / "slow" / "1" / "model.py").write_text(_SLOW_MODEL)
    return repo


def test_readiness_timeout_stops_the_server(tmp_path, write_config):
    repo = _slow_repository(tmp_path / "repo")
    workdir = tmp_path / "wd"
    result = run_cli("deploy", str(write_config(CONFIG)), "--workdir", str(workdir), "--repository", str(repo), "--timeout", "3")
    assert result.returncode == 1
    assert "error: deploy: not ready after 3s" in result.stderr
    state = json.loads((workdir / "deploy" / "state.json").read_text())
    assert not group_alive(state["pgid"])


def test_shared_fixture_serves_concurrent_streams(tiny_triton):
    from trtllm_forge.client import generate

    prompts = [" ".join(f"w{i}x{j}" for j in range(6)) for i in range(8)]
    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(lambda p: generate(tiny_triton, p, 5, stream=True, model="words"), prompts))
    for prompt, result in zip(prompts, results, strict=False):
        assert result.text == " ".join(prompt.split()[:5]) + " "
        assert len(result.chunks) == 5


def test_serving_stops_the_server_on_errors(tmp_path):
    from trtllm_forge.deploy import server_status, serving

    repo = write_tiny_repository(tmp_path / "repo")
    with pytest.raises(RuntimeError, match="boom"), serving(forge_test_config(), tmp_path / "wd", repo) as deployment:
        pgid = deployment.pgid
        assert server_status(tmp_path / "wd").running
        raise RuntimeError("boom")
    assert not group_alive(pgid)
    assert server_status(tmp_path / "wd").running is False


def test_ctrl_c_while_waiting_stops_the_server(tmp_path, write_config):
    repo = _slow_repository(tmp_path / "repo")
    workdir = tmp_path / "wd"
    argv = [sys.executable, "-m", "trtllm_forge", "deploy", str(write_config(CONFIG)), "--workdir", str(workdir), "--repository", str(repo)]
    # A shell starts background jobs with SIGINT ignored and exec keeps that: give the CLI the default a terminal gives.
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    state_file = workdir / "deploy" / "state.json"
    deadline = time.monotonic() + 30
    while not state_file.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert state_file.exists(), "deploy never recorded the server"
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert stderr.rstrip().splitlines()[-1].startswith("error: ")
    state = json.loads(state_file.read_text())
    assert state["running"] is False and not group_alive(state["pgid"])


def test_status_notices_a_dead_server_and_stop_cleans_up(triton_launcher, tmp_path):
    from trtllm_forge.deploy import server_status, stop_server

    deployment = triton_launcher(write_tiny_repository(tmp_path / "repo"), workdir=tmp_path / "wd")
    os.kill(deployment.pid, signal.SIGKILL)  # the leader only: its stubs stay behind in the group
    time.sleep(0.5)
    status = server_status(tmp_path / "wd")
    assert status.running is False and not any(status.models.values())
    stop_server(tmp_path / "wd", grace_s=5)
    assert not group_alive(deployment.pgid)


def test_a_picked_port_taken_before_bind_is_picked_again(tmp_path, monkeypatch):
    import socket

    from trtllm_forge.deploy import launch, start_server, stop_server

    real = launch.resolve_ports
    calls = []
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()

        def racy(config):
            ports = real(config)
            if not calls:  # the first pick loses the race for the HTTP port
                ports["http"] = busy.getsockname()[1]
            calls.append(ports)
            return ports

        monkeypatch.setattr(launch, "resolve_ports", racy)
        deployment = start_server(forge_test_config(), tmp_path / "wd", write_tiny_repository(tmp_path / "repo"))
        try:
            assert len(calls) == 2 and deployment.ports == calls[1]
            assert deployment.running and all(deployment.models.values())
        finally:
            stop_server(deployment)
    assert not group_alive(deployment.pgid)
