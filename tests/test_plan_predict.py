"""`plan --predict`: NVIDIA AIConfigurator, run for real and offline in its own venv (.venv-aiconfigurator, made by
`make setup`), beside forge's roofline.

One real estimate (configs/llama3.1-8b-fp8-h100.yaml on h100_sxm, ~8 s), one refusal by AIConfigurator itself
(Mixtral-8x7B on h100_sxm is not in its support matrix), one catalog call that checks our name table against what
the installed AIConfigurator has; the rest never starts it.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from cli_inprocess import run_in_process
from conftest import CONFIGS, REPO

from trtllm_forge.config import load_config
from trtllm_forge.errors import ConfigError
from trtllm_forge.hardware import hardware_table
from trtllm_forge.model_shape import ModelShape, catalog_shape
from trtllm_forge.plan import make_plan
from trtllm_forge.plan.aiconfigurator import MODELS, SYSTEMS, Request, catalog, request_for

SHAPE_FIELDS = (
    "num_hidden_layers",
    "hidden_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
    "vocab_size",
    "num_local_experts",
    "num_experts_per_tok",
)


def pinned_version() -> str:
    """The AIConfigurator version `make setup` installs (the Makefile's AIC_PACKAGES)."""
    match = re.search(r"^AIC_PACKAGES := aiconfigurator==(\S+) aiconfigurator-core==(\S+)$", (REPO / "Makefile").read_text(), re.M)
    assert match and match.group(1) == match.group(2)
    return match.group(1)


@pytest.fixture(autouse=True)
def host_profile(tmp_path, monkeypatch):
    monkeypatch.setenv("TRTLLM_FORGE_CPU_PROFILE", str(tmp_path / "cache" / "hardware-cpu.json"))


@pytest.fixture(scope="module")
def llama_prediction(tmp_path_factory):
    """The one real estimate: `plan --predict --json` on the shipped Llama-3.1-8B FP8 H100 config."""
    workdir = tmp_path_factory.mktemp("predict") / "wd"
    result = run_in_process(
        "plan", str(CONFIGS / "llama3.1-8b-fp8-h100.yaml"), "--predict", "--json", "--no-plot", "--workdir", str(workdir)
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout), result.stderr, workdir


def test_real_estimate_is_labelled_simulated_with_its_versions(llama_prediction):
    data, _, workdir = llama_prediction
    prediction = data["prediction"]
    assert prediction["status"] == "simulated", prediction["reason"]
    assert prediction["source"] == "aiconfigurator"
    assert prediction["version"] == prediction["database_version"] == pinned_version()
    assert prediction["database_source"] == "aiconfigurator-core"
    # Its TensorRT-LLM database is of the 1.3 line (LLM API / PyTorch backend), one of those it has for the system.
    assert prediction["backend"] == "trtllm" and prediction["system"] == SYSTEMS["H100-SXM"].aiconfigurator
    assert prediction["backend_version"] in prediction["backend_versions"]
    assert prediction["backend_version"].startswith("1.3.")
    assert json.loads((workdir / "plan" / "plan.json").read_text())["prediction"] == prediction


def test_real_estimate_asks_for_the_configs_workload(llama_prediction):
    data, _, _ = llama_prediction
    config = load_config(CONFIGS / "llama3.1-8b-fp8-h100.yaml")
    inputs, workload = data["prediction"]["inputs"], data["kv_cache"]["workload"]
    assert (inputs["isl"], inputs["osl"]) == (workload["input_len"], workload["output_len"])
    assert inputs["batch_size"] == config.engine.max_batch_size
    assert (inputs["tp_size"], inputs["pp_size"]) == (config.parallel.tp, config.parallel.pp)
    assert (inputs["gemm_quant_mode"], inputs["kvcache_quant_mode"]) == ("fp8", "fp8")
    assert inputs["free_gpu_memory_fraction"] == config.runtime.kv_cache_free_gpu_mem_fraction
    # EAGLE is in the config but not in AIConfigurator's model: said, not dropped silently.
    assert any("eagle is not simulated" in note for note in data["prediction"]["notes"])


def test_real_estimate_is_consistent_and_never_beats_the_roofline(llama_prediction):
    data, _, _ = llama_prediction
    values, batch = data["prediction"]["values"], str(data["prediction"]["inputs"]["batch_size"])
    roof = data["roofline"]
    assert values["tokens_per_s_per_user"] == pytest.approx(1e3 / values["tpot_ms"], rel=1e-6)
    assert values["gpus"] == 1 and values["tokens_per_s_per_gpu"] == pytest.approx(values["tokens_per_s"])
    # The roofline is the physical limit: a simulation of real kernels is slower, at the same batch size.
    assert values["tpot_ms"] >= roof["tpot_ms"][batch]
    assert values["tokens_per_s_per_gpu"] <= roof["decode_tokens_per_s"][batch]
    assert values["ttft_ms"] >= roof["prefill_ms"]["1"]  # one prompt prefilled alone
    # The FP8 weights and the batch's KV cache fit in the 80 GiB it simulates, and hold more than the weights.
    weights_gib = data["memory"]["weights_bytes_per_gpu"] / 1024**3
    assert weights_gib < values["memory_gib_per_gpu"] < data["hardware"]["memory_gb"]


def test_real_estimate_in_the_plan_table(llama_prediction):
    data, stderr, _ = llama_prediction
    prediction = data["prediction"]
    title = next(line for line in stderr.splitlines() if line.startswith("Prediction at batch"))
    assert f"AIConfigurator {prediction['version']} (simulated" in title
    assert f"TensorRT-LLM {prediction['backend_version']}" in title
    simulated = next(line for line in stderr.splitlines() if "AIConfigurator (simulated)" in line)
    assert f"{prediction['values']['tpot_ms']:.2f}" in simulated
    roofline = next(line for line in stderr.splitlines() if "forge roofline" in line)
    assert f"{data['roofline']['tpot_ms'][str(prediction['inputs']['batch_size'])]:.2f}" in roofline


def test_a_combination_aiconfigurator_refuses_is_one_line(tmp_path):
    """Mixtral-8x7B has a bundled config but no passing run in the support matrix: AIConfigurator refuses it."""
    result = run_in_process(
        "plan", str(CONFIGS / "mixtral-8x7b-fp16-h100x8-ep.yaml"), "--predict", "--json", "--no-plot", "--workdir", str(tmp_path)
    )
    assert result.returncode == 0, result.stderr
    prediction = json.loads(result.stdout)["prediction"]
    assert prediction["status"] == "unsupported"
    assert prediction["model"] == MODELS["mistralai/Mixtral-8x7B-Instruct-v0.1"].aiconfigurator
    assert "support matrix" in prediction["reason"] and prediction["values"] == {}
    refusals = [line for line in result.stderr.splitlines() if "prediction" in line]
    assert refusals == [f"warning: prediction refused: {prediction['reason']}"]
    assert "Traceback" not in result.stderr and "Prediction at batch" not in result.stderr


def test_a_gpu_without_a_database_is_refused_before_asking(tmp_path, monkeypatch):
    # Nothing is started: the interpreter it would run does not exist.
    monkeypatch.setenv("FORGE_AICONFIGURATOR_PYTHON", str(tmp_path / "absent" / "python"))
    result = run_in_process("plan", str(CONFIGS / "mistral-7b-int4awq-a10g.yaml"), "--predict", "--json", "--no-plot", "--dry-run")
    assert result.returncode == 0, result.stderr
    prediction = json.loads(result.stdout)["prediction"]
    assert prediction["status"] == "unsupported"
    assert prediction["reason"].startswith("hardware.gpu: AIConfigurator has no TensorRT-LLM database for A10G; it has one for H100-SXM")
    assert [line for line in result.stderr.splitlines() if "prediction" in line] == [f"warning: prediction refused: {prediction['reason']}"]


def test_engine_path_config_is_predicted_for_the_llm_api(write_config):
    config = load_config(
        write_config("""
model: {source: /nonexistent/Llama-3.1-8B-Instruct, name: meta-llama/Llama-3.1-8B-Instruct, dtype: float16}
engine: {backend: tensorrt-llm, target: engine, max_batch_size: 16, max_input_len: 1024, max_seq_len: 2048}
quantization: {algorithm: int4_awq, calibration: {dataset: /data/calibration.jsonl}}
parallel: {tp: 2}
hardware: {gpu: H200}
""")
    )
    request = request_for(make_plan(config))
    assert isinstance(request, Request)
    assert (request.system, request.model) == ("h200_sxm", "meta-llama/Meta-Llama-3.1-8B")
    assert request.arguments["tp_size"] == 2 and request.arguments["gemm_quant_mode"] == "int4_wo"
    assert request.arguments["kvcache_quant_mode"] == "bfloat16"
    assert any("1.2.x engine" in note and "no 1.2 engine-path" in note for note in request.notes)
    assert any("int4_awq is simulated as int4_wo" in note for note in request.notes)


def test_quantization_it_cannot_simulate_is_refused(write_config):
    config = load_config(
        write_config("""
model: {source: /nonexistent/Llama-3.1-8B-Instruct, name: meta-llama/Llama-3.1-8B-Instruct}
engine: {backend: tensorrt-llm, max_batch_size: 8, max_input_len: 1024, max_seq_len: 2048}
quantization: {algorithm: w4a8_awq}
hardware: {gpu: H100-SXM}
""")
    )
    refusal = request_for(make_plan(config))
    assert isinstance(refusal, ConfigError) and refusal.where == "quantization.algorithm"
    assert "w4a8_awq" in refusal.problem and "fp8" in refusal.valid


def test_not_installed_and_not_importable_are_unavailable(tmp_path):
    config = str(CONFIGS / "llama3.1-8b-fp8-h100.yaml")
    absent = run_in_process(
        "plan", config, "--predict", "--json", "--dry-run", env={"FORGE_AICONFIGURATOR_PYTHON": str(tmp_path / "python")}
    )
    prediction = json.loads(absent.stdout)["prediction"]
    assert prediction["status"] == "unavailable" and "make setup" in prediction["reason"]
    # A real interpreter without AIConfigurator (this venv's): the bridge runs, exits 0, and says so in its answer.
    wrong = run_in_process("plan", config, "--predict", "--json", "--dry-run", env={"FORGE_AICONFIGURATOR_PYTHON": sys.executable})
    prediction = json.loads(wrong.stdout)["prediction"]
    assert prediction["status"] == "unavailable"
    assert prediction["reason"].startswith(f"AIConfigurator is not importable by {Path(sys.executable)}")
    assert [line for line in wrong.stderr.splitlines() if "prediction" in line] == [
        f"warning: prediction unavailable: {prediction['reason']}"
    ]


def test_name_table_matches_the_installed_aiconfigurator():
    found = catalog()
    assert found["status"] == "ok", found.get("reason")
    assert found["versions"] == {"aiconfigurator": pinned_version(), "aiconfigurator-core": pinned_version()}
    devices = hardware_table()
    for ours, match in SYSTEMS.items():
        assert ours in devices, ours
        assert found["databases"].get(match.aiconfigurator, {}).get("trtllm"), f"{match.aiconfigurator} has no TensorRT-LLM database"
    for ours, match in MODELS.items():
        shape = catalog_shape(ours)
        assert shape is not None, f"{ours} is not in data/model_catalog.json"
        theirs = ModelShape.from_hf_config(json.loads(Path(found["model_configs"][match.aiconfigurator]).read_text()), match.aiconfigurator)
        assert {f: getattr(theirs, f) for f in SHAPE_FIELDS} == {f: getattr(shape, f) for f in SHAPE_FIELDS}, ours
