"""The embedded default end to end, exactly as `make demo` runs it: import → build → render → real Triton →
smoke → verify against transformers → report, with no server left behind."""

from __future__ import annotations

import json
import subprocess

import pytest

from conftest import CONFIGS, run_cli

pytestmark = pytest.mark.slow


def tritonservers_for(workdir) -> list[str]:
    out = subprocess.run(["pgrep", "-af", "tritonserver"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if str(workdir) in line]


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("e2e") / "wd"
    result = run_cli("run", str(CONFIGS / "smollm2-cpu.yaml"), "--workdir", str(workdir), "--json", timeout=1200)
    return workdir, result


def test_run_serves_paris_and_verifies(first_run):
    workdir, result = first_run
    assert result.returncode == 0, result.stderr[-3000:]
    doc = json.loads(result.stdout)
    assert "Paris" in doc["answer"]
    assert doc["passed"] is True and doc["stream_matches"] is True
    assert doc["verify"]["passed"] and doc["verify"]["agreement"]["prefix"] == 1.0
    assert [s["name"] for s in doc["stages"]] == ["import", "build", "render", "deploy", "smoke", "verify", "bench"]
    assert all(s["status"] in ("done", "skipped") for s in doc["stages"])
    assert (workdir / "verify" / "report.json").is_file()
    for stage in ("import", "build", "render"):
        assert json.loads((workdir / stage / "manifest.json").read_text())["status"] == "ok"


def test_run_leaves_no_server_behind(first_run):
    workdir, result = first_run
    assert tritonservers_for(workdir) == []
    state = json.loads((workdir / "deploy" / "state.json").read_text())
    assert state["running"] is False


def test_human_report_names_answer_logs_and_query_commands(first_run):
    workdir, result = first_run
    err = result.stderr
    assert "The capital of France is Paris" in err
    assert str(workdir / "logs") in err and str(workdir / "render" / "model_repository") in err
    assert "curl -s -X POST http://127.0.0.1:" in err and "/v2/models/ensemble/generate" in err
    assert "from trtllm_forge.client import generate" in err


def test_second_run_skips_cached_stages_and_keep_serving(first_run):
    workdir, _ = first_run
    result = run_cli("run", str(CONFIGS / "smollm2-cpu.yaml"), "--workdir", str(workdir), "--json", "--keep-serving", timeout=900)
    try:
        assert result.returncode == 0, result.stderr[-3000:]
        doc = json.loads(result.stdout)
        status = {s["name"]: s["status"] for s in doc["stages"]}
        assert status["import"] == status["build"] == status["render"] == "skipped"
        assert doc["serving"]["running"] is True
        live = run_cli("deploy", "status", "--workdir", str(workdir), "--json")
        assert json.loads(live.stdout)["running"] is True
    finally:
        stopped = run_cli("deploy", "stop", "--workdir", str(workdir))
    assert stopped.returncode == 0, stopped.stderr
    assert tritonservers_for(workdir) == []
