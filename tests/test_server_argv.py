"""Every way trtllm-forge starts tritonserver passes the same flags (trtllm_forge/deploy/server_argv.py): the local
deploy, the rendered launch.sh, the docker and Kubernetes renderings and the benchmark's own servers. Only the
per-target parameters (binary, repository, ports, bind address, backend directory) may differ."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from bench_support.local_triton import server_argv as bench_argv

from trtllm_forge.config.schema import ForgeConfig
from trtllm_forge.deploy import launch as deploy_launch
from trtllm_forge.deploy import targets
from trtllm_forge.deploy.discovery import find_tritonserver
from trtllm_forge.deploy.server_argv import PORT_NAMES, tritonserver_argv
from trtllm_forge.render import launch as render_launch

PARAMETERS = {"model-repository", "backend-directory", *(f"{n}-port" for n in PORT_NAMES), *(f"{n}-address" for n in PORT_NAMES)}


def flags(args: list[str]) -> dict[str, str]:
    """`--name=value` (or bare `--name`) arguments as {name: value}; a positional argument fails the test."""
    out = {}
    for arg in args:
        assert arg.startswith("--"), f"not a --flag argument: {arg!r}"
        name, _, value = arg[2:].partition("=")
        assert name not in out, f"--{name} given twice"
        out[name] = value
    return out


def launch_script_args(script: str) -> list[str]:
    """The tritonserver arguments of launch.sh's exec line, as bash would split them (port overrides unexpanded)."""
    command = script.split("\nexec ", 1)[1].replace("\\\n", " ")
    return shlex.split(command)[1:]


@pytest.fixture
def setup(tmp_path):
    config = ForgeConfig.model_validate(
        {
            "name": "argv",
            "model": {"source": "smollm2-135m", "name": "HuggingFaceTB/SmolLM2-135M-Instruct"},
            "engine": {"backend": "openvino"},
            "hardware": {"gpu": "cpu"},
            "triton": {"http_port": 0, "grpc_port": 0, "metrics_port": 0, "bind_address": "127.0.0.1"},
            "deploy": {"image": "forge-cpu:1"},
        }
    )
    workdir = tmp_path / "wd"
    repository = tmp_path / "repo"
    (repository / "echo").mkdir(parents=True)
    (repository / "echo" / "config.pbtxt").write_text('name: "echo"\nbackend: "python"\n')
    return config, workdir, repository


def renderings(config: ForgeConfig, workdir: Path, repository: Path) -> dict[str, list[str]]:
    install = find_tritonserver()
    deploy = deploy_launch.plan_launch(config, workdir, repository)
    ports = (deploy.ports["http"], deploy.ports["grpc"], deploy.ports["metrics"])
    script = render_launch.plan_launch(config, repository, install=install, backend_dir=deploy.backend_dir, ports=ports).script()
    docker = targets.docker_argv(config, workdir, repository)
    [kubernetes] = [d for d in targets.kubernetes_documents(config, workdir, repository) if d["kind"] == "Deployment"]
    return {
        "deploy": deploy.argv[1:],
        "launch.sh": launch_script_args(script),
        "docker": docker[docker.index("forge-cpu:1") + 2 :],
        "kubernetes": kubernetes["spec"]["template"]["spec"]["containers"][0]["command"][1:],
        "bench": bench_argv(install.binary, repository, deploy.ports, deploy.backend_dir)[1:],
    }


def test_every_rendering_passes_the_same_flags(setup):
    config, workdir, repository = setup
    parsed = {name: flags(args) for name, args in renderings(config, workdir, repository).items()}
    fixed = {name: {k: v for k, v in found.items() if k not in PARAMETERS} for name, found in parsed.items()}
    assert all(found == fixed["deploy"] for found in fixed.values()), fixed
    for name, found in parsed.items():
        assert set(found) >= PARAMETERS - {"backend-directory"}, name
        assert found["model-control-mode"] == "none" and "disable-auto-complete-config" in found
    # The parameters that do differ, as each target needs them.
    for name in ("deploy", "launch.sh", "bench"):
        assert {parsed[name][f"{n}-address"] for n in PORT_NAMES} == {"127.0.0.1"}, name
        assert Path(parsed[name]["model-repository"]).resolve() == repository.resolve(), name
    for name in ("docker", "kubernetes"):
        assert {parsed[name][f"{n}-address"] for n in PORT_NAMES} == {"0.0.0.0"}, name
        assert [parsed[name][f"{n}-port"] for n in PORT_NAMES] == ["8000", "8001", "8002"], name
    assert parsed["launch.sh"]["http-port"] == f"${{HTTP_PORT:-{parsed['deploy']['http-port']}}}"


def test_launch_sh_carries_the_flags_the_local_deploy_passes(setup):
    """launch.sh once lacked --model-control-mode, --metrics-address and --exit-timeout-secs."""
    config, workdir, repository = setup
    found = renderings(config, workdir, repository)
    names = {name: {arg.split("=", 1)[0] for arg in args} for name, args in found.items()}
    assert names["launch.sh"] == names["deploy"]


def test_leader_mode_ranks_differ_only_in_what_they_load():
    ports = {"http": 1, "grpc": 2, "metrics": 3}
    leader = flags(tritonserver_argv("tritonserver", "/repo", ports, "0.0.0.0")[1:])
    worker = flags(tritonserver_argv("tritonserver", "/repo", ports, "0.0.0.0", rank=2, engine_models=("tensorrt_llm",))[1:])
    assert worker.pop("load-model") == "tensorrt_llm" and worker.pop("model-control-mode") == "explicit"
    assert leader.pop("model-control-mode") == "none"
    assert worker.pop("backend-config") == "python,shm-region-prefix-name=prefix2_"
    assert leader.pop("backend-config") == "python,shm-region-prefix-name=prefix0_"
    assert worker == leader
