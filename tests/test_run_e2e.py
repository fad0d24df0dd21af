"""The embedded default end to end, as `make demo` runs it: import → build → render → real Triton →
smoke → verify against transformers → report, with no server left behind. The import and the build are the
session's (`trtllm-forge import` of the same config, conftest.imported_smollm2, and its fp32 build,
conftest.cpu_engine_fp32): here the run finds them up to date and skips them. `run` building for real is
test_onnxruntime_chain.py's."""

from __future__ import annotations

import json
import subprocess

import pytest
from chain_helpers import assert_chain_passed, reused_workdir, run_chain
from conftest import CONFIGS, processes_with, run_cli

pytestmark = pytest.mark.slow


def tritonservers_for(workdir) -> list[int]:
    return processes_with("tritonserver", str(workdir))


@pytest.fixture(scope="module")
def first_run(tmp_path_factory, imported_smollm2, cpu_engine_fp32, chain_host_profile):
    workdir = reused_workdir(tmp_path_factory.mktemp("e2e"), imported_smollm2.parent, cpu_engine_fp32[0] / "build")
    return workdir, run_chain(workdir, CONFIGS / "smollm2-cpu.yaml", host_profile=chain_host_profile, timeout=1200)


def test_run_serves_paris_and_verifies(first_run):
    workdir, result = first_run
    assert result.returncode == 0, result.stderr[-3000:]
    doc = json.loads(result.stdout)
    assert_chain_passed(doc, concurrencies=[1, 8], requests_per_point=16, reused=("import", "build"))
    assert doc["passed"] is True
    assert (workdir / "verify" / "report.json").is_file()
    for stage in ("import", "build", "render"):
        assert json.loads((workdir / stage / "manifest.json").read_text())["status"] == "ok"


def test_the_reused_stages_serve_this_workdirs_files(first_run, cpu_engine_fp32, imported_smollm2):
    """The import and build came from other workdirs (linked, records unchanged): the repository render wrote
    names this workdir's engine and checkpoint, never the workdirs they came from."""
    workdir, result = first_run
    assert result.returncode == 0, result.stderr[-3000:]
    rendered = "\n".join(p.read_text() for p in (workdir / "render").rglob("config.pbtxt"))
    assert str(workdir / "build" / "engine") in rendered
    for elsewhere in (cpu_engine_fp32[0], imported_smollm2.parent.parent):
        assert f"{elsewhere}/" not in rendered


def test_run_benchmarks_against_the_roofline(first_run):
    workdir, result = first_run
    doc = json.loads(result.stdout)
    (workload,) = doc["bench"]["workloads"]
    points = workload["points"]  # every request of both points completed: test_run_serves_paris_and_verifies
    assert points[1]["metrics"]["output_token_throughput_per_s"]["avg"] > points[0]["metrics"]["output_token_throughput_per_s"]["avg"]
    rows = doc["bench"]["roofline"]
    assert [r["concurrency"] for r in rows] == [1, 8]
    assert all(r["roofline_tokens_per_s"] > 0 and r["percent_of_roofline"] > 0 for r in rows)
    assert (workdir / "bench" / "chat-short").is_dir()
    assert "% of limit" in result.stderr


def test_run_leaves_no_server_behind(first_run):
    workdir, _result = first_run
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


def test_second_run_skips_cached_stages_and_keep_serving(first_run, chain_host_profile):
    """The second run verifies with transformers' answers from the first run's (the session's) reference cache."""
    workdir, _ = first_run
    result = run_chain(
        workdir,
        CONFIGS / "smollm2-cpu.yaml",
        "--keep-serving",
        "--skip-bench",
        host_profile=chain_host_profile,
        timeout=900,
    )
    try:
        assert result.returncode == 0, result.stderr[-3000:]
        doc = json.loads(result.stdout)
        status = {s["name"]: s["status"] for s in doc["stages"]}
        assert status["import"] == status["build"] == status["render"] == "skipped"
        assert status["smoke"] == "done" and "Paris" in doc["answer"]
        assert status["verify"] == "done" and doc["verify"]["passed"] is True and "bench" not in status
        assert doc["verify"]["reference"]["source"] == "cache", doc["verify"]["reference"]
        assert doc["serving"]["running"] is True
        live = run_cli("deploy", "status", "--workdir", str(workdir), "--json")
        assert json.loads(live.stdout)["running"] is True
    finally:
        stopped = run_cli("deploy", "stop", "--workdir", str(workdir))
    assert stopped.returncode == 0, stopped.stderr
    assert tritonservers_for(workdir) == []


def test_sigterm_during_run_stops_the_server(first_run):
    """SIGTERM (what a CI runner or `kill` sends) while the server is up still stops it: no orphan left."""
    import os
    import signal
    import sys
    import time

    workdir, _ = first_run
    state = workdir / "deploy" / "state.json"
    before = state.stat().st_mtime
    proc = subprocess.Popen(
        [sys.executable, "-m", "trtllm_forge", "run", str(CONFIGS / "smollm2-cpu.yaml"), "--workdir", str(workdir), "--skip-bench"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        if state.stat().st_mtime > before and json.loads(state.read_text())["running"]:
            break
        time.sleep(0.2)
    assert proc.poll() is None, "run ended before the server was up"
    assert tritonservers_for(workdir), "the server should be running now"
    os.kill(proc.pid, signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 1, stderr[-2000:]
    assert "terminated by SIGTERM" in stderr and "Traceback" not in stderr
    assert tritonservers_for(workdir) == []
    assert json.loads(state.read_text())["running"] is False
