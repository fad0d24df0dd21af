"""A real container run on CPU (issue #31.2): the session's CPU repository, rendered for `deploy.target: docker`,
served by tritonserver inside the project's CPU image (docker/Containerfile.cpu) through published ports, gives the
same tokens and text as the host-served model; stopped, nothing of it is left. And the mounts: every path a
config.pbtxt names is mounted read-only at the same path, none points into the host's venv."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import cpu_test_config

from trtllm_forge.client import generate, stream_request
from trtllm_forge.containers import run as containers
from trtllm_forge.containers.image import CONTAINERFILE, ensure_image, plan_image, project_digest
from trtllm_forge.containers.mounts import path_parameters, repository_mounts
from trtllm_forge.containers.serve import serving_spec
from trtllm_forge.deploy.launch import free_port
from trtllm_forge.deploy.server import log_tail, server_ready
from trtllm_forge.errors import ConfigError

READY_TIMEOUT_S = 240.0
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


def _wait_ready(runtime, name: str, http_url: str, log: Path, server_log: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if server_ready(http_url):
            return
        current = containers.state(runtime, name, log)
        if current is None or not current.running:
            break
        time.sleep(1.0)
    containers.save_logs(runtime, name, log, server_log)
    pytest.fail(
        f"the container's server is not ready at {http_url} (state {containers.state(runtime, name, log)}):\n{log_tail(server_log)}"
    )


def _tokens(target: str) -> list[int]:
    values = {"input_ids": PROMPT_IDS, "input_lengths": len(PROMPT_IDS), "request_output_len": 12, "temperature": 0.0, "runtime_top_k": 1}
    responses = stream_request(target, "tensorrt_llm", values).responses
    return [int(t) for r in responses for t in np.ravel(r["output_ids"])]


@pytest.mark.slow
def test_cpu_repository_served_from_the_container(container_runtime, cpu_container_image, container_repository, cpu_deployment, tmp_path):
    runtime, log, server_log = container_runtime, tmp_path / "container.log", tmp_path / "tritonserver.log"
    taken: set[int] = set()
    ports = {}
    for name in ("http", "grpc", "metrics"):
        ports[name] = free_port("127.0.0.1", taken)
        taken.add(ports[name])
    spec = serving_spec(cpu_container_image, container_repository, tmp_path, ports)
    label = {containers.DEPLOYMENT_LABEL: spec.labels[containers.DEPLOYMENT_LABEL]}
    # The image holds this source tree (its layers are keyed by content: a stale one would fail here).
    installed = runtime.run(["run", "--rm", cpu_container_image, "cat", "/opt/trtllm-forge/source.sha256"], log).stdout.strip()
    assert installed == project_digest()
    argv = containers.start(runtime, spec, log, dry_run=True)
    assert "--init" in argv and f"127.0.0.1:{ports['grpc']}:8001" in argv and "--http-address=0.0.0.0" in argv
    try:
        containers.start(runtime, spec, log)
        _wait_ready(runtime, spec.name, f"http://127.0.0.1:{ports['http']}", log, server_log)
        served = f"127.0.0.1:{ports['grpc']}"
        tokens = _tokens(served)
        assert len(tokens) == 12 and tokens == _tokens(cpu_deployment.grpc_url)
        text = generate(served, "The capital of France is", 8, temperature=0.0).text
        assert text.strip() and text == generate(cpu_deployment, "The capital of France is", 8, temperature=0.0).text
    finally:
        containers.stop(runtime, spec.name, log, server_log)
    assert containers.labeled(runtime, log, label) == []
    assert "Started GRPCInferenceService at 0.0.0.0:8001" in server_log.read_text()
