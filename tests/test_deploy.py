"""deploy without a running server: CLI shape, dry runs, discovery, port checks, docker/kubernetes renderings."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
import yaml
from cli_inprocess import run_in_process
from conftest import write_tiny_repository

CPU_CONFIG = """name: deploy-fast
model: {source: smollm2-135m}
engine: {backend: openvino}
triton: {http_port: 0, grpc_port: 0, metrics_port: 0}
"""
TP_CONFIG = """name: tp-test
model: {source: smollm2-135m}
engine: {backend: tensorrt-llm}
parallel: {tp: 3}
hardware: {gpu: H100-SXM}
"""


@pytest.fixture
def repo(tmp_path):
    return write_tiny_repository(tmp_path / "repo")


def test_help_lists_the_three_forms():
    result = run_in_process("deploy", "--help")
    assert result.returncode == 0, result.stderr
    for text in ("deploy CONFIG", "status", "stop", "start"):
        assert text in result.stdout


def test_no_arguments_shows_help_and_exits_2():
    result = run_in_process("deploy")
    assert result.returncode == 2
    assert "deploy CONFIG" in result.stderr


@pytest.mark.parametrize("form", [[], ["start"]])
def test_dry_run_prints_the_exact_command_and_changes_nothing(tmp_path, write_config, repo, form):
    config = write_config(CPU_CONFIG)
    workdir = tmp_path / "wd"
    result = run_in_process("deploy", *form, str(config), "--workdir", str(workdir), "--repository", str(repo), "--dry-run", "--json")
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    argv = plan["argv"]
    assert Path(argv[0]).name == "tritonserver"
    for flag in ("--model-control-mode=none", "--http-address=127.0.0.1", "--grpc-address=127.0.0.1", "--metrics-address=127.0.0.1"):
        assert flag in argv
    assert f"--model-repository={repo.resolve()}" in argv
    assert all(plan["ports"][name] > 0 for name in ("http", "grpc", "metrics"))
    assert plan["models"] == ["echo", "words"]
    if plan["tritonserver"]["kind"] == "pytriton":
        assert f"--backend-directory={workdir / 'deploy' / 'backends'}" in argv
        assert "nvidia_pytriton.libs" in plan["env"]["LD_LIBRARY_PATH"]
    assert not workdir.exists(), "a dry run must not create anything"


def test_dry_run_human_output_goes_to_stdout_and_stderr(tmp_path, write_config, repo):
    result = run_in_process(
        "deploy", str(write_config(CPU_CONFIG)), "--workdir", str(tmp_path / "wd"), "--repository", str(repo), "--dry-run"
    )
    assert result.returncode == 0, result.stderr
    assert "tritonserver" in result.stdout.splitlines()[0]
    assert "models to wait for: echo, words" in result.stderr


def test_missing_repository_is_a_usage_error(tmp_path, write_config):
    result = run_in_process("deploy", str(write_config(CPU_CONFIG)), "--workdir", str(tmp_path / "wd"), "--dry-run")
    assert result.returncode == 2
    assert result.stderr.startswith("error: --repository:")
    assert "trtllm-forge render" in result.stderr
    assert "Traceback" not in result.stderr


def test_configured_port_in_use_is_a_clear_error(tmp_path, write_config, repo):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        config = write_config(CPU_CONFIG.replace("http_port: 0", f"http_port: {port}"))
        result = run_in_process("deploy", str(config), "--workdir", str(tmp_path / "wd"), "--repository", str(repo))
    assert result.returncode == 1
    assert f"error: triton.http_port: port {port} on 127.0.0.1 is already in use" in result.stderr
    assert "http_port: 0" in result.stderr
    assert not (tmp_path / "wd" / "deploy" / "state.json").exists()


def test_status_and_stop_when_nothing_was_deployed(tmp_path, write_config):
    config = write_config(CPU_CONFIG)
    status = run_in_process("deploy", "status", str(config), "--workdir", str(tmp_path / "wd"), "--json")
    assert status.returncode == 3, status.stderr  # not running
    data = json.loads(status.stdout)
    assert data["running"] is False and data["pid"] is None and data["models"] == {}
    stop = run_in_process("deploy", "stop", "--workdir", str(tmp_path / "wd"))
    assert stop.returncode == 0
    assert "nothing to stop" in stop.stderr


def test_status_needs_config_or_workdir():
    result = run_in_process("deploy", "status")
    assert result.returncode == 2
    assert result.stderr.startswith("error: deploy status: needs CONFIG or --workdir")


def test_world_size_above_one_needs_the_rendered_leader_command(tmp_path, write_config, repo):
    config = write_config(TP_CONFIG)
    workdir = tmp_path / "wd"
    result = run_in_process("deploy", str(config), "--workdir", str(workdir), "--repository", str(repo), "--dry-run")
    assert result.returncode == 2
    assert "MPI leader-mode command" in result.stderr

    leader = ["mpirun", "--allow-run-as-root"]
    for rank in range(3):
        leader += [":"] * bool(rank) + [
            "-n",
            "1",
            "/opt/tritonserver/bin/tritonserver",
            f"--model-repository={repo}",
            f"--backend-config=python,shm-region-prefix-name=prefix{rank}_",
        ]
    (workdir / "render").mkdir(parents=True)
    (workdir / "render" / "manifest.json").write_text(json.dumps({"outputs": {"launch_command": leader}}))
    result = run_in_process("deploy", str(config), "--workdir", str(workdir), "--repository", str(repo), "--dry-run", "--json")
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert plan["argv"] == leader and plan["world_size"] == 3
    assert plan["ports"] == {"http": 8000, "grpc": 8001, "metrics": 8002}


def test_docker_target_renders_the_run_command(tmp_path, write_config, repo):
    """Rendered text only: there is no Docker engine on this machine."""
    config = write_config(TP_CONFIG.replace("tp-test", "gpu") + "triton: {http_port: 9000}\n")
    workdir = tmp_path / "wd"
    (workdir / "render").mkdir(parents=True)
    (workdir / "render" / "manifest.json").write_text(json.dumps({"outputs": {"launch_command": "mpirun -n 3 tritonserver"}}))
    result = run_in_process("deploy", str(config), "--workdir", str(workdir), "--repository", str(repo), "--target", "docker")
    assert result.returncode == 0, result.stderr
    script = (workdir / "deploy" / "docker-run.sh").read_text()
    assert script == result.stdout
    # A GPU engine is never run here: the command is written and the output says so.
    assert "written, not run: engine.backend tensorrt-llm serves on a GPU" in result.stderr
    assert not (workdir / "deploy" / "state.json").exists()
    assert "docker run --detach --name trtllm-forge-gpu" in script
    assert "--gpus 3" in script and "--shm-size=1g" in script
    assert "-p 127.0.0.1:9000:8000" in script
    # The serving image of the pinned TensorRT-LLM 1.2.1: the newest NGC image that ships it.
    # Every rank in the container: the image's tritonserver, rank 0 on every interface (not the rendered local
    # command, which binds triton.bind_address: the published port could never reach it).
    inside = f"-v {workdir}:{workdir}:ro nvcr.io/nvidia/tritonserver:26.07-trtllm-python-py3 mpirun --allow-run-as-root -n 1 /opt/tritonserver/bin/tritonserver "
    assert inside in script and "mpirun -n 3 tritonserver" not in script
    assert script.count("--http-address=0.0.0.0") == 3 and "127.0.0.1 " not in script.split("26.07-trtllm-python-py3")[1]


def test_kubernetes_target_renders_a_valid_manifest(tmp_path, write_config, repo):
    """Rendered text only: no cluster is contacted."""
    config = write_config(CPU_CONFIG + "deploy: {resources: {cpus: 2, memory_gb: 4}, image: forge-cpu:1}\n")
    workdir = tmp_path / "wd"
    result = run_in_process(
        "deploy", str(config), "--workdir", str(workdir), "--repository", str(repo), "--target", "kubernetes", "--dry-run"
    )
    assert result.returncode == 0, result.stderr
    assert not workdir.exists()
    claim, deployment, service = yaml.safe_load_all(result.stdout)
    assert claim["kind"] == "PersistentVolumeClaim" and deployment["kind"] == "Deployment" and service["kind"] == "Service"
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "forge-cpu:1"
    assert container["command"][:2] == ["tritonserver", f"--model-repository={repo.resolve()}"]
    assert container["resources"]["limits"] == {"cpu": "2", "memory": "4Gi"}
    assert container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert {p["port"] for p in service["spec"]["ports"]} == {8000, 8001, 8002}


def test_no_tritonserver_anywhere_says_how_to_install(monkeypatch, tmp_path):
    from trtllm_forge.deploy import discovery
    from trtllm_forge.errors import StepError

    monkeypatch.setattr(discovery.shutil, "which", lambda name: None)
    monkeypatch.setattr(discovery, "OPT_TRITONSERVER", tmp_path / "missing")
    monkeypatch.setattr(discovery, "_pytriton_root", lambda: None)
    with pytest.raises(StepError) as caught:
        discovery.find_tritonserver()
    assert "no tritonserver found" in caught.value.format_message()
    assert "pip install --no-deps nvidia-pytriton" in caught.value.format_message()


def test_venv_with_numpy_2_is_refused_for_the_wheel_stub(monkeypatch, tmp_path):
    from trtllm_forge.deploy import discovery
    from trtllm_forge.errors import StepError

    install = discovery.find_tritonserver()
    if install.kind != "pytriton":
        pytest.skip("only the nvidia-pytriton stub is built against NumPy 1")
    discovery.check_stub_numpy(install)  # this venv: NumPy 1.x, accepted
    (tmp_path / "numpy-2.1.0.dist-info").mkdir()
    monkeypatch.setattr(discovery, "venv_site_packages", lambda: tmp_path)
    with pytest.raises(StepError) as caught:
        discovery.check_stub_numpy(install)
    assert "numpy>=1.26,<2" in caught.value.format_message()


def test_execution_env_with_numpy_2_is_refused(tmp_path, write_config, repo):
    from trtllm_forge.deploy import discovery

    if discovery.find_tritonserver().kind != "pytriton":
        pytest.skip("only the nvidia-pytriton stub is built against NumPy 1")
    numpy2_env = tmp_path / "numpy2-env"
    (numpy2_env / "lib" / "python3.11" / "site-packages" / "numpy-2.1.0.dist-info").mkdir(parents=True)
    config_pbtxt = repo / "echo" / "config.pbtxt"
    config_pbtxt.write_text(
        config_pbtxt.read_text() + f'parameters {{ key: "EXECUTION_ENV_PATH" value: {{ string_value: "{numpy2_env}" }} }}\n'
    )
    result = run_in_process(
        "deploy", str(write_config(CPU_CONFIG)), "--workdir", str(tmp_path / "wd"), "--repository", str(repo), "--dry-run"
    )
    assert result.returncode == 2
    assert result.stderr.startswith(f"error: {config_pbtxt}: EXECUTION_ENV_PATH={numpy2_env} gives the nvidia-pytriton")
    assert "numpy<2" in result.stderr
