"""`trtllm-forge plan` through the real CLI: JSON contract, refusal with the smallest fix, host calibration."""

from __future__ import annotations

import json

import pytest
from cli_inprocess import run_in_process
from conftest import CONFIGS

from trtllm_forge.config import load_config
from trtllm_forge.plan import make_plan

EXAMPLES = [
    "llama3.1-8b-fp8-h100",
    "mistral-7b-int4awq-a10g",
    "qwen2.5-7b-fp16-l40s-tp2",
    "llama3.1-70b-fp8-h200-tp4",
    "mixtral-8x7b-fp16-h100x8-ep",
    "smollm2-cpu",
]


@pytest.fixture(autouse=True)
def host_profile(tmp_path, monkeypatch):
    """Every test gets its own (initially absent) measured-cpu file, never the user's."""
    path = tmp_path / "cache" / "hardware-cpu.json"
    monkeypatch.setenv("TRTLLM_FORGE_CPU_PROFILE", str(path))
    return path


@pytest.mark.parametrize("name", [n for n in EXAMPLES if (CONFIGS / f"{n}.yaml").exists()])
def test_example_configs_fit_their_hardware(name):
    plan = make_plan(load_config(CONFIGS / f"{name}.yaml"))
    assert plan.fits
    assert plan.max_concurrent_sequences >= 1
    assert plan.weights_bytes_per_gpu < plan.device.memory_gb * 1e9


def test_plan_json_keys_and_files(tmp_path, write_config):
    config = write_config("""
model: {source: /nonexistent/Llama-3.1-8B-Instruct, name: meta-llama/Llama-3.1-8B-Instruct, dtype: bfloat16}
engine: {backend: tensorrt-llm, max_batch_size: 64, max_input_len: 4096, max_seq_len: 8192, max_num_tokens: 8192}
quantization: {algorithm: fp8, kv_cache: fp8, calibration: {dataset: /data/calibration.jsonl}}
hardware: {gpu: H100-SXM}
""")
    result = run_in_process("plan", str(config), "--json", "--workdir", str(tmp_path / "wd"))
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["fits"] is True
    assert data["memory"]["weights_bytes_per_gpu"] == 9_081_200_640
    assert data["kv_cache"]["bytes_per_token"] == 65536
    assert data["kv_cache"]["max_tokens"] == 32089 * 32
    assert data["kv_cache"]["max_concurrent_sequences"] == 125
    tokens = data["roofline"]["decode_tokens_per_s"]
    assert set(tokens) == {"1", "2", "4", "8", "16", "32", "64"}
    assert all(tokens[str(a)] < tokens[str(b)] for a, b in ((1, 2), (2, 4), (32, 64)))
    assert [row["algorithm"] for row in data["quantization_comparison"]] == ["none", "fp8", "int4_awq"]
    # capacity (125 sequences) is a limit, never the recommended batch: the config's 64 stays
    assert data["recommendations"]["max_batch_size"] == 64
    assert data["limits"] == {
        "max_batch_size": 64,
        "max_num_tokens": 8192,
        "kv_cache_tokens": 32089 * 32,
        "kv_cache_capacity_sequences": 125,
        "batch_limit": 64,
        "batch_limited_by": "max_batch_size",
    }
    serving = data["serving"]
    assert serving["available"] and serving["instances"] == 1
    points = serving["points"]
    assert [p["concurrency"] for p in points] == [1, 2, 4, 8, 16, 32, 64, 128]
    assert [p["batch"] for p in points] == [1, 2, 4, 8, 16, 32, 64, 64]
    assert points[-1]["limited_by"] == "max_batch_size" and points[-1]["ttft_ms"] > points[-2]["ttft_ms"]
    assert all(p["output_tokens_per_s"] <= tokens[str(p["batch"])] for p in points)  # prefills only slow the decode
    waves = serving["points_in_waves"]
    assert [p["batch"] for p in waves] == [p["batch"] for p in points]
    assert all(w["output_tokens_per_s"] <= tokens[str(w["batch"])] for w in waves)
    assert "capacity: 125 sequences" in result.stderr and "Serving steady state" in result.stderr
    plan_dir = tmp_path / "wd" / "plan"
    assert json.loads((plan_dir / "plan.json").read_text())["kv_cache"] == data["kv_cache"]
    assert (plan_dir / "roofline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "Roofline" in result.stderr and "Quantization choices" in result.stderr


def test_plan_that_cannot_fit_exits_2_with_the_smallest_change(write_config, tmp_path):
    config = write_config("""
model: {source: /nonexistent/Llama-3.1-8B-Instruct, name: meta-llama/Llama-3.1-8B-Instruct, dtype: bfloat16}
engine: {backend: tensorrt-llm, target: engine, max_input_len: 4096, max_seq_len: 131072}
hardware: {gpu: L4}
""")
    result = run_in_process("plan", str(config), "--workdir", str(tmp_path / "wd"))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr
    assert lines[0].startswith("error: engine.max_seq_len: one 131072-token sequence needs 4096 KV blocks")
    assert "smallest change that fits: engine.max_seq_len: 52832" in lines[0]
    assert not (tmp_path / "wd" / "plan").exists()

    as_json = run_in_process("plan", str(config), "--json", "--workdir", str(tmp_path / "wd"))
    assert as_json.returncode == 2
    refused = json.loads(as_json.stdout)
    assert refused["fits"] is False and refused["refusal"]["field"] == "engine.max_seq_len"


def test_kv_cap_below_one_sequence_names_the_cap(write_config, tmp_path):
    config = write_config("""
model: {source: /nonexistent/Llama-3.1-8B-Instruct, name: meta-llama/Llama-3.1-8B-Instruct}
engine: {backend: tensorrt-llm, target: engine, max_input_len: 2048, max_seq_len: 34816, tokens_per_block: 128}
runtime: {max_tokens_in_paged_kv_cache: 29184}
hardware: {gpu: H100-SXM}
""")
    result = run_in_process("plan", str(config), "--workdir", str(tmp_path / "wd"))
    assert result.returncode == 2
    assert result.stderr.startswith("error: runtime.max_tokens_in_paged_kv_cache: ")
    assert "smallest change that fits: runtime.max_tokens_in_paged_kv_cache: 34816" in result.stderr


def test_measure_host_is_stored_and_used_by_later_plans(tmp_path, host_profile):
    cpu_config = str(CONFIGS / "smollm2-cpu.yaml")
    before = run_in_process("plan", cpu_config, "--json", "--no-plot", "--workdir", str(tmp_path / "a"))
    assert before.returncode == 0, before.stderr
    assert json.loads(before.stdout)["roofline"]["available"] is False

    measured = run_in_process("plan", "--measure-host", "--json")
    assert measured.returncode == 0, measured.stderr
    profile = json.loads(host_profile.read_text())
    assert profile["bandwidth_gb_s"] > 0.5 and profile["fp32_tflops"] > 0.001 and profile["memory_gb"] > 1
    assert json.loads(measured.stdout)["host"]["bandwidth_gb_s"] == profile["bandwidth_gb_s"]

    after = run_in_process("plan", cpu_config, "--json", "--workdir", str(tmp_path / "b"))
    assert after.returncode == 0, after.stderr
    data = json.loads(after.stdout)
    assert data["hardware"]["bandwidth_gb_s"] == profile["bandwidth_gb_s"]
    assert data["hardware"]["fp32_tflops"] == profile["fp32_tflops"]
    assert data["roofline"]["available"] is True and data["roofline"]["decode_tokens_per_s"]["1"] > 0
    assert data["kv_cache"]["max_tokens"] == 32768  # the config's cap
    serving = data["serving"]
    assert serving["available"] and serving["instances_share_host"]
    assert [p["concurrency"] for p in serving["points"]] == [1, 2, 4, 8, 16, 32]
    assert all(p["batch"] <= 16 and p["ttft_ms"] > 0 and p["tpot_ms"] > 0 for p in serving["points"])
    assert (tmp_path / "b" / "plan" / "roofline.png").is_file()


def test_dry_run_writes_nothing(tmp_path, host_profile):
    result = run_in_process("plan", str(CONFIGS / "smollm2-cpu.yaml"), "--measure-host", "--dry-run", "--workdir", str(tmp_path / "wd"))
    assert result.returncode == 0, result.stderr
    assert "would write" in result.stderr
    assert not host_profile.exists() and not (tmp_path / "wd").exists()


def test_usage_errors_exit_2(tmp_path):
    assert run_in_process("plan").returncode == 2
    too_long = run_in_process(
        "plan", str(CONFIGS / "smollm2-cpu.yaml"), "--input-len", "1024", "--output-len", "4096", "--workdir", str(tmp_path)
    )
    assert too_long.returncode == 2
    assert too_long.stderr.startswith("error: --output-len: input + output = 5120 tokens exceeds engine.max_seq_len")
