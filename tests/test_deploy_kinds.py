"""The server-kind contract (trtllm_forge/deploy/kinds/): the registry is the one list of deploy.server values, every
kind implements the protocol, status exit codes per process, and no module outside the kinds switches on a kind's
name. The real servers behind it: test_deploy_server.py / test_deploy_processes.py (Triton), test_llmapi_serve.py
(trtllm-serve's CPU stand-in)."""

from __future__ import annotations

import importlib
import json
import os
import re
from pathlib import Path

import pytest
from cli_inprocess import run_in_process

from trtllm_forge.config.checks import RULES
from trtllm_forge.config.schema import DeployConfig
from trtllm_forge.deploy.kinds import DEFAULT_KIND, KINDS, Deployment, ServerKind, Speaks, deployed
from trtllm_forge.deploy.kinds.protocol import NOT_RUNNING_EXIT, UNHEALTHY_EXIT, DeploymentStatus, ProcessStatus
from trtllm_forge.deploy.kinds.trtllm_serve import TrtllmServeDeployment
from trtllm_forge.server_kinds import SERVER_KINDS

PACKAGE = Path(__file__).resolve().parents[1] / "trtllm_forge"
KINDS_DIR = PACKAGE / "deploy" / "kinds"


def test_schema_offers_exactly_the_registered_kinds():
    schema = DeployConfig.model_json_schema()["properties"]["server"]
    assert schema["enum"] == list(KINDS) and schema["default"] == DEFAULT_KIND
    assert all(f"{name}: " in schema["description"] for name in KINDS)
    with pytest.raises(ValueError, match="Input should be"):
        DeployConfig(server="dynamo-not-yet")


@pytest.mark.parametrize("name", sorted(KINDS))
def test_every_kind_implements_the_protocol_and_registers_its_rules(name):
    kind = KINDS[name]
    assert isinstance(kind, ServerKind) and kind.name == name
    assert kind.serves_bench_target(kind.default_bench_target)
    (entry,) = [entry for entry in SERVER_KINDS if entry.name == name]
    for reference in entry.config_rules:
        module_name, _, function_name = reference.partition(":")
        assert callable(getattr(importlib.import_module(module_name), function_name)), reference
        assert function_name in RULES, f"{name}'s rule {function_name} is not applied by config/checks.py"


def _status(*alive: bool, running: bool = True) -> DeploymentStatus:
    deployment = TrtllmServeDeployment("http://127.0.0.1:9", "/m", 1, "/l", ["x", "/m", "--backend"], stand_in=True, running=running)
    processes = [ProcessStatus(f"worker-{i}", 100 + i, up, up) for i, up in enumerate(alive)]
    return DeploymentStatus("trtllm-serve", deployment, processes)


def test_status_exit_code_names_a_dead_process():
    """A deployment of several processes (a frontend and workers) is unhealthy when one of them is dead."""
    assert _status(True, True).exit_code == 0
    assert _status(True, False).exit_code == UNHEALTHY_EXIT
    assert _status(True, running=False).exit_code == NOT_RUNNING_EXIT
    document = _status(True, False).to_dict()
    assert document["speaks"] == "openai" and [p["alive"] for p in document["processes"]] == [True, False]


def test_an_openai_deployment_speaks_openai_and_names_its_model():
    deployment = _status(True).deployment
    assert isinstance(deployment, Deployment) and deployment.speaks is Speaks.OPENAI
    assert deployment.served_model == "/m" and deployment.http_url == "http://127.0.0.1:9"


def test_status_and_stop_find_a_dead_trtllm_serve_record(tmp_path):
    """`deploy status` reads every kind's record, not only Triton's state.json: a trtllm-serve whose pid no longer
    runs the recorded command is reported (server, dead process, exit 3), and `deploy stop` removes the record
    without signalling the pid (here this test's own)."""
    record = tmp_path / "wd" / "deploy" / "trtllm-serve.json"
    record.parent.mkdir(parents=True)
    argv = ["python", "-m", "stand-in", "/wd/model", "--backend", "pytorch"]
    record.write_text(json.dumps({"argv": argv, "url": "http://127.0.0.1:9", "stand_in": True, "pid": os.getpid(), "log": "/l"}))
    found = deployed(tmp_path / "wd")
    assert found is not None and found.server == "trtllm-serve" and found.deployment.served_model == "/wd/model"
    status = run_in_process("deploy", "status", "--workdir", str(tmp_path / "wd"), "--json")
    assert status.returncode == NOT_RUNNING_EXIT, status.stderr
    document = json.loads(status.stdout)
    assert document["server"] == "trtllm-serve" and document["running"] is False
    assert [(p["role"], p["pid"], p["alive"]) for p in document["processes"]] == [("trtllm-serve", os.getpid(), False)]
    stop = run_in_process("deploy", "stop", "--workdir", str(tmp_path / "wd"), "--json")
    assert stop.returncode == 0, stop.stderr
    assert json.loads(stop.stdout)["server"] == "trtllm-serve" and not record.exists()
    assert run_in_process("deploy", "status", "--workdir", str(tmp_path / "wd")).returncode == NOT_RUNNING_EXIT


def test_no_module_outside_the_kinds_switches_on_a_kind_name():
    names = "|".join(re.escape(name) for name in KINDS)
    checks = [
        re.compile(rf"""(==|!=)\s*["']({names})["']"""),
        re.compile(rf"""["']({names})["']\s*(==|!=)"""),
        re.compile(r"""deploy\.server\s*(==|!=|in\b)\s*["'(\[{]"""),
        re.compile(r"hasattr\(deployment|OpenAIDeployment"),
    ]
    found = []
    for path in PACKAGE.rglob("*.py"):
        if KINDS_DIR in path.parents:
            continue
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            if any(check.search(line) for check in checks):
                found.append(f"{path.relative_to(PACKAGE)}:{number}: {line.strip()}")
    assert found == []


@pytest.mark.parametrize(
    ("backend", "target", "runs"),
    [("openvino", "local", True), ("openvino", "docker", True), ("openvino", "kubernetes", False), ("tensorrt-llm", "docker", False)],
)
def test_triton_runs_cpu_configs_in_a_container_and_renders_the_rest(backend, target, runs):
    """`deploy --target docker` runs a CPU config in the CPU image's container, and only writes the `docker run`
    script of a GPU config; Kubernetes is always rendered. The runner a start uses follows the same rule."""
    from trtllm_forge.config.schema import ForgeConfig
    from trtllm_forge.deploy.container_runner import CONTAINER_RUNNER
    from trtllm_forge.deploy.server import runner_for

    data = {"name": "k", "model": {"source": "smollm2-135m"}, "engine": {"backend": backend}, "deploy": {"target": target}}
    if backend == "tensorrt-llm":
        data["hardware"] = {"gpu": "H100-SXM"}
    config = ForgeConfig.model_validate(data)
    assert KINDS["triton"].runs(config) is runs
    assert (runner_for(config) is CONTAINER_RUNNER) is (runs and target == "docker")
    assert KINDS["trtllm-serve"].runs(config) is (target == "local")
