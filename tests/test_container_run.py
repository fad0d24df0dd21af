"""A real container run on CPU (issue #31.2): configs/smollm2-cpu.yaml with `deploy.target: docker`, served by
tritonserver inside the project's CPU image (docker/Containerfile.cpu) through ports published on 127.0.0.1.

`run` end to end (the session's import and build reused, a tiny bench) keeps its container; a `podman kill` of it is
reported by `deploy status` (non-zero, naming the container and its exit code), `deploy stop` leaves no container of
the workdir. Then `deploy --target docker` on the same workdir: `--dry-run` prints the runtime's commands and writes
nothing; for real, `deploy status` says running with the published URLs, the served tokens and text equal the
host-served model's, and `deploy stop` leaves nothing (checked by label). Two container starts in all, on the
session's one image. And the mounts: every path a config.pbtxt names is mounted read-only at the same path, none
points into the host's venv."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from chain_helpers import reused_workdir, run_chain
from conftest import CONFIGS, cpu_test_config, run_cli

from trtllm_forge.client import generate, stream_request
from trtllm_forge.containers import run as containers
from trtllm_forge.containers.image import CONTAINERFILE, ensure_image, plan_image, project_digest
from trtllm_forge.containers.mounts import path_parameters, repository_mounts
from trtllm_forge.errors import ConfigError

PROMPT_IDS = [504, 3575, 282, 4649, 314]  # "The capital of France is" in SmolLM2's tokenizer


def _render(cpu_engine_fp32, directory: Path, target: str) -> Path:
    from trtllm_forge.engine_config import read_engine_config
    from trtllm_forge.render.repository import write_repository

    _, build = cpu_engine_fp32
    engine = read_engine_config(Path(build.manifest["outputs"]["engine_dir"]))
    config = cpu_test_config(deploy={"target": target})
    return write_repository(config, directory, engine, "cpu", directory / "model_repository").repository


@pytest.fixture(scope="module")
def container_repository(cpu_engine_fp32, tmp_path_factory) -> Path:
    """The session's CPU repository (configs/smollm2-cpu.yaml on the fp32 build) rendered for a container."""
    return _render(cpu_engine_fp32, tmp_path_factory.mktemp("container-render"), "docker")


def test_every_path_the_repository_names_is_mounted_read_only(container_repository, cpu_engine_fp32, tmp_path):
    named = path_parameters(container_repository)
    mounts = repository_mounts(container_repository)
    keys = {p.key for p in named}
    assert {"gpt_model_path", "tokenizer_dir"} <= keys, keys
    assert "EXECUTION_ENV_PATH" not in keys  # the container's python models run in the image's venv
    host_env = Path(sys.prefix).resolve()
    for mount in mounts:
        assert mount.read_only and mount.source == mount.target, mount
        assert host_env not in (mount.source, *mount.source.parents), mount
    for parameter in [*named]:
        path = parameter.path.resolve()
        assert any(m.source in (path, *path.parents) for m in mounts), (parameter, mounts)
    assert container_repository.resolve() in {m.source for m in mounts}

    # The same repository rendered for the local target points its python models at this host's venv: refused,
    # naming the file and the parameter.
    local = _render(cpu_engine_fp32, tmp_path, "local")
    with pytest.raises(ConfigError) as refused:
        repository_mounts(local)
    message = refused.value.format_message()
    assert "config.pbtxt parameter EXECUTION_ENV_PATH" in message and "deploy.target: docker" in message, message


def test_image_is_keyed_by_its_content(container_runtime, tmp_path):
    """The tag is a hash of what the image is made of: the same twice, another when a source file changes (and not
    when only bytecode does); the dry run lists the commands of a build from nothing and runs none of them."""
    assert plan_image().tag == plan_image().tag
    tree = tmp_path / "tree"
    (tree / "trtllm_forge" / "__pycache__").mkdir(parents=True)
    (tree / "pyproject.toml").write_text("[project]\n")
    (tree / "trtllm_forge" / "cli.py").write_text("print('a')\n")
    before = project_digest(tree)
    (tree / "trtllm_forge" / "__pycache__" / "cli.cpython-311.pyc").write_bytes(b"\0")
    assert project_digest(tree) == before
    (tree / "trtllm_forge" / "cli.py").write_text("print('b')\n")
    assert project_digest(tree) != before

    dry = ensure_image(container_runtime, tmp_path / "image.log", dry_run=True, context_root=tmp_path / "context")
    assert dry.commands[0][0] == "mmdebstrap" and dry.commands[1][1:3] == ["import", str(dry.commands[0][-1])]
    assert dry.commands[-1][1:3] == ["build", "--file"] and dry.commands[-1][3] == str(CONTAINERFILE)
    assert dry.commands[-1][dry.commands[-1].index("--tag") + 1] == dry.tag and not dry.built
    assert not (tmp_path / "context").exists() and not (tmp_path / "image.log").exists()


def _tokens(target: str) -> list[int]:
    values = {"input_ids": PROMPT_IDS, "input_lengths": len(PROMPT_IDS), "request_output_len": 12, "temperature": 0.0, "runtime_top_k": 1}
    responses = stream_request(target, "tensorrt_llm", values).responses
    return [int(t) for r in responses for t in np.ravel(r["output_ids"])]


@pytest.fixture(scope="module")
def docker_config(tmp_path_factory) -> Path:
    """configs/smollm2-cpu.yaml with deploy.target docker and a bench of four short requests."""
    data = yaml.safe_load((CONFIGS / "smollm2-cpu.yaml").read_text())
    data["deploy"]["target"] = "docker"
    data["bench"]["workloads"][0].update(concurrency=[1], num_requests=4, input_len=16, output_len=8)
    path = tmp_path_factory.mktemp("docker-config") / "smollm2-docker.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def docker_run(docker_config, cpu_container_image, imported_smollm2, cpu_engine_fp32, chain_host_profile, tmp_path_factory):
    """(workdir, `run --keep-serving --json` of the docker config): the session's import and build reused, its
    container kept for the tests below (and removed at the end whatever they did)."""
    workdir = reused_workdir(tmp_path_factory.mktemp("docker-run"), imported_smollm2.parent, cpu_engine_fp32[0] / "build")
    try:
        yield workdir, run_chain(workdir, docker_config, "--keep-serving", host_profile=chain_host_profile, timeout=900)
    finally:
        run_cli("deploy", "stop", "--workdir", str(workdir))


def _status(workdir: Path) -> tuple[int, dict]:
    proc = run_cli("deploy", "status", "--workdir", str(workdir), "--json")
    return proc.returncode, json.loads(proc.stdout)


def _workdir_containers(runtime, workdir: Path, log: Path) -> list[str]:
    return containers.labeled(runtime, log, {containers.DEPLOYMENT_LABEL: str(workdir.resolve())})


@pytest.mark.slow
def test_run_serves_smoke_verify_and_bench_through_the_container(docker_run, container_runtime, cpu_container_image, tmp_path):
    _, proc = docker_run
    assert proc.returncode == 0, proc.stderr[-4000:]
    doc = json.loads(proc.stdout)
    status = {s["name"]: s["status"] for s in doc["stages"]}
    assert status == {
        "import": "skipped",
        "build": "skipped",
        "render": "done",
        "deploy": "done",
        "smoke": "done",
        "verify": "done",
        "bench": "done",
    }
    assert "Paris" in doc["answer"] and doc["stream_matches"] and doc["verify"]["passed"]
    serving = doc["serving"]
    assert serving["target"] == "docker" and serving["image"] == cpu_container_image and serving["container"]
    requests = doc["bench"]["workloads"][0]["requests"]  # one load point: the workload's document is that point
    assert requests["completed"] == 4 and requests["failed"] == 0, requests
    # What smoke, verify and bench reached: the container's ports, published on 127.0.0.1 (nothing served from here).
    state = containers.state(container_runtime, serving["container"], tmp_path / "runtime.log")
    assert state is not None and state.running and state.labels[containers.RUN_LABEL] == serving["run_id"]
    for name, inside in (("http", 8000), ("grpc", 8001), ("metrics", 8002)):
        assert f"127.0.0.1:{serving['ports'][name]}:{inside}" in serving["command"]
    assert serving["http_url"] == f"http://127.0.0.1:{serving['ports']['http']}"
    # The repository was rendered for the container: no python model points at this host's venv.
    assert "EXECUTION_ENV_PATH" not in {p.key for p in path_parameters(Path(serving["repository"]))}


@pytest.mark.slow
def test_a_killed_container_is_named_by_status_and_stop_leaves_none(docker_run, container_runtime, tmp_path):
    workdir, proc = docker_run
    assert proc.returncode == 0, proc.stderr[-2000:]
    code, before = _status(workdir)
    assert code == 0 and before["running"] and before["processes"][0]["alive"], before
    name = before["container"]
    container_runtime.run(["kill", name], tmp_path / "runtime.log")

    human = run_cli("deploy", "status", "--workdir", str(workdir))
    assert human.returncode == 3, human.stderr  # not running, as for a dead local server
    assert f"container {name} exited with code 137 (killed)" in human.stderr, human.stderr
    code, after = _status(workdir)
    assert code == 3 and not after["running"] and not after["processes"][0]["alive"]
    assert any(name in problem and "137" in problem for problem in after["problems"]), after

    stopped = run_cli("deploy", "stop", "--workdir", str(workdir))
    assert stopped.returncode == 0, stopped.stderr
    assert _workdir_containers(container_runtime, workdir, tmp_path / "runtime.log") == []
    assert "Started GRPCInferenceService at 0.0.0.0:8001" in Path(after["log"]).read_text()  # its output, kept


def _files(workdir: Path) -> dict[str, float]:
    return {str(path): path.stat().st_mtime for path in sorted(workdir.rglob("*")) if path.is_file()}


@pytest.mark.slow
def test_deploy_dry_run_prints_the_runtime_commands_and_writes_nothing(docker_run, docker_config, container_runtime, cpu_container_image):
    workdir, _ = docker_run
    before = _files(workdir)
    proc = run_cli("deploy", str(docker_config), "--workdir", str(workdir), "--target", "docker", "--dry-run", "--json")
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert plan["where"] == "docker" and plan["image"] == cpu_container_image and plan["image_present"] is True
    argv = plan["argv"]
    assert argv[:4] == [str(container_runtime.binary), "run", "--detach", "--init"]
    assert argv[argv.index(cpu_container_image) + 1 :][:2] == ["tritonserver", f"--model-repository={plan['repository']}"]
    assert f"127.0.0.1:{plan['ports']['grpc']}:8001" in argv and "--grpc-address=0.0.0.0" in argv
    assert all(volume.endswith(":ro") for volume in plan["mounts"])
    human = run_cli("deploy", str(docker_config), "--workdir", str(workdir), "--target", "docker", "--dry-run")
    assert human.returncode == 0 and f"CONTAINERS_CONF={container_runtime.env.get('CONTAINERS_CONF')}" in human.stdout
    assert " run --detach --init " in human.stdout and " stop --time 20 " in human.stdout
    assert _files(workdir) == before, "a dry run must not write anything"
    assert _workdir_containers(container_runtime, workdir, Path("/dev/null")) == []


@pytest.mark.slow
def test_deploy_to_docker_status_generate_stop(docker_run, docker_config, container_runtime, cpu_container_image, cpu_deployment, tmp_path):
    workdir, _ = docker_run
    log = tmp_path / "runtime.log"
    # The image holds this source tree (its layers are keyed by content: a stale one would fail here).
    installed = container_runtime.run(["run", "--rm", cpu_container_image, "cat", "/opt/trtllm-forge/source.sha256"], log).stdout.strip()
    assert installed == project_digest()
    started = run_cli("deploy", str(docker_config), "--workdir", str(workdir), "--target", "docker", "--json", timeout=600)
    try:
        assert started.returncode == 0, started.stderr[-3000:]
        code, status = _status(workdir)
        assert code == 0 and status["running"] and status["target"] == "docker", status
        assert status["processes"][0]["role"] == f"container {status['container']}" and status["processes"][0]["alive"]
        assert all(status["models"].values()) and status["grpc_url"] == f"127.0.0.1:{status['ports']['grpc']}"
        assert _workdir_containers(container_runtime, workdir, log) == [status["container"]]
        tokens = _tokens(status["grpc_url"])
        assert len(tokens) == 12 and tokens == _tokens(cpu_deployment.grpc_url)
        text = generate(status["grpc_url"], "The capital of France is", 8, temperature=0.0).text
        assert text.strip() and text == generate(cpu_deployment, "The capital of France is", 8, temperature=0.0).text
    finally:
        stopped = run_cli("deploy", "stop", "--workdir", str(workdir))
    assert stopped.returncode == 0, stopped.stderr
    code, after = _status(workdir)
    assert code == 3 and not after["running"] and after["problems"] == []
    assert _workdir_containers(container_runtime, workdir, log) == []
