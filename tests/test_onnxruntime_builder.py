"""The ONNX Runtime GenAI builder's plan, the config rules and plan estimates for engine.backend onnxruntime (no model
is loaded here; the chain with the real builder, engine and Triton is tests/test_onnxruntime_chain.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from cli_inprocess import run_in_process
from conftest import CONFIGS
from trtllm_forge.builders.onnxruntime.builder import plan_build

from trtllm_forge.config import ForgeConfig, load_config
from trtllm_forge.errors import ConfigError

CONFIG = CONFIGS / "smollm2-cpu-onnxruntime.yaml"


def _config(**sections) -> ForgeConfig:
    data = load_config(CONFIG).model_dump(mode="json")
    for section, values in sections.items():
        data[section].update(values)
    return ForgeConfig.model_validate({**data, "config_dir": str(CONFIGS)})


@pytest.mark.parametrize(
    ("algorithm", "precision", "extra"),
    [("none", "fp32", []), ("int8_wo", "int8", ["--extra_options", "block_size=32", "accuracy_level=4"]),
     ("int4_wo", "int4", ["--extra_options", "block_size=32", "accuracy_level=4"])],
)  # fmt: skip
def test_plan_is_the_model_builder_command(tmp_path: Path, algorithm: str, precision: str, extra: list[str]):
    config = _config(quantization={"algorithm": algorithm, "group_size": 32})
    plan = plan_build(config, tmp_path, tmp_path / "ckpt")
    (argv,) = plan.commands
    assert argv == [
        sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(tmp_path / "ckpt"),
        "-o", str(tmp_path / "build" / "engine"), "-p", precision, "-e", "cpu", "-c", str(tmp_path / "build" / "builder-cache"), *extra,
    ]  # fmt: skip
    assert plan.export.precision == precision and plan.to_json()["backend"] == "onnxruntime"


@pytest.mark.parametrize(
    ("section", "values", "field"),
    [
        ("quantization", {"algorithm": "int4_awq"}, "quantization.algorithm"),
        ("quantization", {"algorithm": "fp8"}, "quantization.algorithm"),
        ("quantization", {"kv_cache": "int8"}, "quantization.kv_cache"),
        ("engine", {"speculative": {"mode": "prompt_lookup", "max_draft_len": 4}}, "engine.speculative.mode"),
        ("engine", {"target": "llmapi"}, "engine.target"),
        ("runtime", {"enable_kv_cache_reuse": True}, "runtime.enable_kv_cache_reuse"),
    ],
)
def test_what_the_engine_cannot_serve_is_refused_naming_the_field(write_config, section, values, field):
    data = load_config(CONFIG).model_dump(mode="json", exclude_defaults=True)
    data.setdefault(section, {}).update(values)
    path = write_config(json.dumps(data))
    outcome = run_in_process("config", "validate", str(path))
    assert outcome.returncode == 2, outcome.stderr
    assert f"{field}:" in outcome.stderr and "onnxruntime" in outcome.stderr


def test_group_size_outside_the_builders_block_sizes_is_a_config_error(tmp_path):
    from trtllm_forge.builders.onnxruntime.plan import plan_export

    config = _config(quantization={"algorithm": "int4_wo", "group_size": 8})
    with pytest.raises(ConfigError, match="block size"):
        plan_export(config, tmp_path, tmp_path / "out", tmp_path / "cache")


def test_run_dry_run_prints_the_builder_command_and_writes_nothing(tmp_path):
    outcome = run_in_process("run", str(CONFIG), "--dry-run", "--json", "--workdir", str(tmp_path / "wd"))
    assert outcome.returncode == 0, outcome.stderr
    doc = json.loads(outcome.stdout)
    assert doc["build"]["backend"] == "onnxruntime"
    (argv,) = doc["build"]["commands"]
    assert argv[1:3] == ["-m", "onnxruntime_genai.models.builder"] and argv[argv.index("-p") + 1] == "fp32"
    assert not (tmp_path / "wd").exists()


def test_plan_sizes_int4_weights_below_fp32():
    from trtllm_forge.plan.planner import make_plan

    fp32 = make_plan(_config())
    int4 = make_plan(_config(quantization={"algorithm": "int4_wo", "group_size": 32}))
    assert fp32.dtype == "float32" and fp32.kv_dtype_bytes == 4
    assert int4.weights_bytes_per_gpu < fp32.weights_bytes_per_gpu / 3
