"""docker/Dockerfile, the rendered container commands and scripts/gpu_smoke.sh (no Docker engine or GPU here:
the rendered text and the script's own logic are tested, with a FAKE trtllm-forge for the script)."""

from __future__ import annotations

import os
import re
import stat
import subprocess

from trtllm_forge.builders.tensorrt_llm.execute import container_command
from trtllm_forge.builders.tensorrt_llm.plan import plan_build
from trtllm_forge.builders.tensorrt_llm.spec import load_spec
from trtllm_helpers import REPO, example

SPEC = load_spec()


def test_dockerfile_defaults_match_the_pinned_spec():
    text = (REPO / "docker" / "Dockerfile").read_text()
    assert re.search(r"^ARG BASE_IMAGE=(\S+)$", text, re.M).group(1) == SPEC.base_image
    assert re.search(r"^ARG TRTLLM_VERSION=(\S+)$", text, re.M).group(1) == SPEC.version
    assert "FROM ${BASE_IMAGE}" in text
    for path in ("trtllm_forge", "builders", "plugins", "model_repo_templates"):
        assert f"COPY {path} ./{path}" in text


def test_container_command_mounts_every_input_at_the_same_path(tmp_path):
    config = example(REPO / "configs" / "qwen2.5-7b-fp16-l40s-tp2.yaml")
    plan = plan_build(config)
    commands = container_command(config, plan, tmp_path / "wd")
    run = commands["docker_run"]
    mounts = [run[i + 1] for i, arg in enumerate(run) if arg == "-v"]
    assert "/models/Qwen2.5-7B-Instruct:/models/Qwen2.5-7B-Instruct:ro" in mounts
    assert "/models/Qwen2.5-0.5B-Instruct:/models/Qwen2.5-0.5B-Instruct:ro" in mounts
    assert f"{tmp_path / 'wd'}:{tmp_path / 'wd'}:rw" in mounts
    assert run[run.index("--gpus") + 1] == "2"
    image = commands["image"]
    assert image == "trtllm-forge:0.1.0-trtllm1.2.1"
    assert run[run.index(image) + 1 : run.index(image) + 4] == [
        "trtllm-forge",
        "build-engine",
        str(REPO / "configs" / "qwen2.5-7b-fp16-l40s-tp2.yaml"),
    ]
    build = commands["docker_build"]
    assert build[:4] == ["docker", "build", "-f", "docker/Dockerfile"] and f"BASE_IMAGE={SPEC.base_image}" in build


def test_build_container_names_the_config_file_it_was_given(tmp_path):
    """Two files in one folder with the same `name:`: the command runs build-engine on the one that was loaded."""
    source = (REPO / "configs" / "qwen2.5-7b-fp16-l40s-tp2.yaml").read_text()
    (tmp_path / "a-first.yaml").write_text(source.replace("max_batch_size: ", "max_batch_size: 1", 1))
    given = tmp_path / "b-given.yaml"
    given.write_text(source)
    config = example(given)
    run = container_command(config, plan_build(config), tmp_path / "wd")["docker_run"]
    assert run[run.index("build-engine") + 1] == str(given)


def test_the_commands_name_the_example_scripts_where_the_image_has_them(tmp_path, monkeypatch):
    monkeypatch.delenv("TRTLLM_FORGE_EXAMPLES_DIR", raising=False)
    text = (REPO / "docker" / "Dockerfile").read_text()
    image_dir = re.search(r"^ENV TRTLLM_FORGE_EXAMPLES_DIR=(\S+)$", text, re.M).group(1)
    assert 'mv /tmp/trtllm/examples "$TRTLLM_FORGE_EXAMPLES_DIR"' in text
    plan = plan_build(example(REPO / "configs" / "qwen2.5-7b-fp16-l40s-tp2.yaml"))
    scripts = [arg for step in plan.steps for arg in step.argv if arg.endswith(".py")]
    assert scripts and all(s.startswith(image_dir + "/") for s in scripts)


def test_a_multi_node_engine_is_built_on_one_node(tmp_path):
    config = example(REPO / "configs" / "llama3.1-405b-bf16-h100x16-2node.yaml")
    plan = plan_build(config)
    run = container_command(config, plan, tmp_path / "wd")["docker_run"]
    assert run[run.index("--gpus") + 1] == str(config.parallel.gpus_per_node) == "8"  # one 8-GPU node, not 16 GPUs
    build = next(step.argv for step in plan.steps if step.tool == "trtllm-build")
    assert build[build.index("--workers") + 1] == "8"
    assert len([f for f in plan.files if f.startswith("engine/rank")]) == 16
    assert any(w.code == "multi_node_build_on_one_node" for w in plan.warnings)


def test_the_image_has_kubectl_for_the_multi_node_launcher():
    from trtllm_forge.deploy.kubernetes import rsh_agent_script

    text = (REPO / "docker" / "Dockerfile").read_text()
    assert "/usr/local/bin/kubectl" in text and "sha256sum --check" in text
    assert "exec kubectl exec" in rsh_agent_script("tritonserver")


def _fake_forge(tmp_path, fail_step: str | None):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "trtllm-forge"
    fake.write_text(
        "#!/usr/bin/env bash\n# FAKE trtllm-forge for the smoke script's own logic\n"
        f'echo "$@" >> "{tmp_path}/calls.txt"\n'
        f'if [ "$1" = "{fail_step or "-"}" ]; then exit 1; fi\n'
    )
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "WORK": str(tmp_path / "smoke")}


def test_gpu_smoke_script_all_pass(tmp_path):
    (tmp_path / "smoke").mkdir()
    env = _fake_forge(tmp_path, None)
    result = subprocess.run(
        ["bash", str(REPO / "scripts" / "gpu_smoke.sh"), "/models/Qwen2.5-0.5B-Instruct", "L4"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    calls = (tmp_path / "calls.txt").read_text().splitlines()
    assert [c.split(" /")[0] for c in calls] == ["import", "build-engine", "render", "deploy start", "verify", "bench", "deploy stop"]
    assert all("gpu-smoke.yaml --workdir" in c for c in calls)
    assert result.stdout.count(" pass") == 7
    assert "gpu: L4" in (tmp_path / "smoke" / "gpu-smoke.yaml").read_text()


def test_gpu_smoke_script_reports_failure_and_still_stops_the_server(tmp_path):
    (tmp_path / "smoke").mkdir()
    env = _fake_forge(tmp_path, "render")
    result = subprocess.run(
        ["bash", str(REPO / "scripts" / "gpu_smoke.sh"), "/models/m"], capture_output=True, text=True, env=env, timeout=60
    )
    assert result.returncode == 1
    table = result.stdout
    assert re.search(r"render\s+FAIL", table) and re.search(r"bench\s+skipped", table)
    assert (tmp_path / "calls.txt").read_text().splitlines()[-1].startswith("deploy stop")
