"""`run --json` keeps its promise of one JSON document on stdout when something fails, and the stage
table says "failed" for a check that ran and failed."""

from __future__ import annotations

import json
from types import SimpleNamespace

from cli_inprocess import run_in_process

from trtllm_forge.pipeline import RunReport, _Stages, stage_table
from trtllm_forge.ui import console


def test_invalid_config_gives_one_json_error_document(write_config):
    path = write_config("model:\n  source: smollm2-135m\nmodel:\n  source: x\n")
    outcome = run_in_process("run", str(path), "--json")
    assert outcome.returncode == 2 and outcome.exception is None
    doc = json.loads(outcome.stdout)
    assert doc["passed"] is False and doc["stages"] == []
    error = doc["error"]
    assert error["kind"] == "config" and error["exit_code"] == 2
    assert error["errors"][0]["where"] == "model" and error["errors"][0]["source"] == f"{path}:3"
    assert outcome.stderr.strip().startswith(f"error: {path}:3: model: duplicate key")


def test_a_failing_stage_gives_the_report_so_far_and_the_error(write_config, tmp_path):
    path = write_config("model:\n  source: ./no-such-checkpoint\nengine:\n  backend: openvino\n")
    outcome = run_in_process("run", str(path), "--json", "--workdir", str(tmp_path / "wd"))
    assert outcome.returncode == 2, outcome.stderr
    doc = json.loads(outcome.stdout)
    assert doc["passed"] is False and doc["workdir"] == str(tmp_path / "wd")
    assert [(s["name"], s["status"]) for s in doc["stages"]] == [("import", "failed")]
    assert "does not exist" in doc["stages"][0]["detail"]
    assert doc["error"]["errors"][0]["where"] == "model.source"


def test_a_failed_verify_is_failed_in_the_stage_table(tmp_path):
    report = RunReport("c", tmp_path)
    stages = _Stages(report)
    failed_check = SimpleNamespace(passed=False, problems=["token agreement 0.40 < 1.00"])
    assert stages.run("verify", lambda: failed_check) is failed_check
    stages.run("smoke", lambda: None)
    assert [(s.name, s.status) for s in report.stages] == [("verify", "failed"), ("smoke", "done")]
    assert report.stages[0].detail == "token agreement 0.40 < 1.00" and not report.passed
    with console.capture() as captured:
        console.print(stage_table(report))
    assert "verify │ failed" in captured.get().replace("  ", " ").replace("  ", " ")
