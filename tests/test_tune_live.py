"""One small real tune on the session's SmolLM2 import and fp32 OpenVINO build (linked into the tune's workdir, so
import and build are skipped): two trials (a render-time knob, and the config as it is) rendered, served by Triton and
benched; a rerun reads both from their directories; and `--emit` / the emitted script / `--import` on a one-trial
space, the round trip a GPU host makes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from chain_helpers import link_stages
from cli_inprocess import run_in_process
from conftest import CONFIGS, TEST_KV_TOKENS

from trtllm_forge.config import load_config
from trtllm_forge.hardware import HOST_PROFILE_ENV

pytestmark = pytest.mark.slow
SLO = "ttft_p99_ms=5000,tpot_p50_ms=500"  # loose: this shared 2-core machine is slow when busy
FIXED = (
    f"engine.max_batch_size: [16]\nengine.max_num_tokens: [2048]\nruntime.max_tokens_in_paged_kv_cache: [{TEST_KV_TOKENS}]\n"
    "triton.instances.preprocessing: [1]\ntriton.instances.postprocessing: [1]\n"
)  # the config's own values: the session's build serves every trial


@pytest.fixture(scope="module")
def config_file(tmp_path_factory) -> Path:
    """configs/smollm2-cpu.yaml with the suite's KV pool (a server of it starts sooner); its engine section, which the
    build hashes, is the session build's."""
    text = (CONFIGS / "smollm2-cpu.yaml").read_text()
    path = tmp_path_factory.mktemp("tune-config") / "smollm2-cpu.yaml"
    path.write_text(text.replace("max_tokens_in_paged_kv_cache: 32768", f"max_tokens_in_paged_kv_cache: {TEST_KV_TOKENS}"))
    return path


def _stages_into(workdir: Path, imported: Path, built: Path) -> Path:
    link_stages(workdir, imported.parent.parent / "import", built / "build")
    return workdir


@pytest.fixture(scope="module")
def tuned(tmp_path_factory, config_file, imported_smollm2, cpu_engine_fp32, chain_host_profile):
    root = tmp_path_factory.mktemp("tune-live")
    space = root / "space.yaml"
    space.write_text(FIXED + "runtime.arrival_window_ms: [0]\n")
    workdir = _stages_into(root / "wd", imported_smollm2, cpu_engine_fp32[0])
    args = ["tune", str(config_file), "--space", str(space), "--slo", SLO, "--concurrency", "2", "--requests", "2", "--trials", "3"]
    env = {HOST_PROFILE_ENV: str(chain_host_profile)}
    first = run_in_process(*args, "--workdir", str(workdir), "--json", env=env)
    again = run_in_process(*args, "--workdir", str(workdir), "--json", env=env)
    return workdir, first, again


def test_a_real_tune_measures_keeps_and_answers(tuned):
    workdir, first, _ = tuned
    assert first.returncode == 0, first.stderr[-3000:]
    doc = json.loads(first.stdout)
    assert doc["trials_used"] == 2 and len(doc["trials"]) == 2
    assert {t["status"] for t in doc["trials"]} == {"done"}
    assert doc["default"]["point"]["runtime.arrival_window_ms"] is None
    assert doc["best"]["goodput"] > 0 and doc["best"]["goodput"] >= doc["default"]["goodput"]  # the default is a candidate too
    for trial in doc["trials"]:
        directory = Path(trial["directory"])
        assert directory.parent == workdir / "tune" / "trials" and directory.name == trial["hash"]
        assert (directory / "trial.json").is_file() and (directory / "config.yaml").is_file()
        assert (directory / "logs" / "tritonserver.log").is_file()  # the server this trial started
        assert trial["points"][0]["concurrency"] == 2 and trial["predicted"]["source"] == "serving model"
    assert "build" not in {p.name.split("-")[0] for t in doc["trials"] for p in (Path(t["directory"]) / "logs").iterdir()}
    best = load_config(doc["files"]["best_config"])
    assert best.runtime.arrival_window_ms == doc["best"]["point"]["runtime.arrival_window_ms"]
    assert run_in_process("config", "validate", doc["files"]["best_config"]).returncode == 0
    assert Path(doc["files"]["pareto_plot"]).stat().st_size > 0


def test_a_rerun_reads_the_finished_trials(tuned):
    _, first, again = tuned
    assert again.returncode == 0, again.stderr[-3000:]
    before, after = json.loads(first.stdout), json.loads(again.stdout)
    assert all(t["cached"] for t in after["trials"])
    assert sorted((t["hash"], t["goodput"]) for t in after["trials"]) == sorted((t["hash"], t["goodput"]) for t in before["trials"])
    assert "Triton ready" not in again.stderr  # no server started


def test_emit_script_and_import_round_trip(tmp_path, config_file, imported_smollm2, cpu_engine_fp32, chain_host_profile):
    space = tmp_path / "space.yaml"
    space.write_text(FIXED + "runtime.arrival_window_ms: [null]\n")  # the config as it is: one trial
    emit_dir = tmp_path / "emit"
    out = run_in_process("tune", str(config_file), "--space", str(space), "--slo", SLO, "--concurrency", "2", "--requests", "2",
                         "--emit", str(emit_dir), "--json")  # fmt: skip
    assert out.returncode == 0, out.stderr
    emitted = json.loads(out.stdout)
    assert len(emitted["trials"]) == 1
    key = emitted["trials"][0]["hash"]
    _stages_into(emit_dir / "work" / key, imported_smollm2, cpu_engine_fp32[0])  # what the GPU host would build
    env = {**os.environ, "TRTLLM_FORGE": f"{sys.executable} -m trtllm_forge", HOST_PROFILE_ENV: str(chain_host_profile)}
    script = subprocess.run(["bash", str(emit_dir / "run_trials.sh")], capture_output=True, text=True, env=env, timeout=600)
    assert script.returncode == 0, script.stderr
    assert f"trial {key}: exit 0" in script.stdout
    assert json.loads((emit_dir / "results" / key / "run.json").read_text())["passed"] is True
    answer = run_in_process("tune", str(config_file), "--import", str(emit_dir), "--workdir", str(tmp_path / "answer"), "--json")
    assert answer.returncode == 0, answer.stderr
    doc = json.loads(answer.stdout)
    assert doc["trials_used"] == 1 and doc["default"]["status"] == "done" and doc["default"]["goodput"] > 0
    assert doc["default"]["points"][0]["concurrency"] == 2
    assert Path(doc["files"]["best_config"]).is_file()
    rerun = subprocess.run(["bash", str(emit_dir / "run_trials.sh")], capture_output=True, text=True, env=env, timeout=60)
    assert f"trial {key}: measured earlier" in rerun.stdout
