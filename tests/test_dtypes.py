"""One rule resolves model.dtype (trtllm_forge.dtypes); plan, import and both builders follow it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from tiny_checkpoint import write_checkpoint_config
from trtllm_forge.builders.engines import engine_of

from trtllm_forge.cli import cli
from trtllm_forge.config.schema import ForgeConfig
from trtllm_forge.dtypes import resolve_model_dtype, stored_dtype

ENGINES = {
    "tensorrt-llm": {"backend": "tensorrt-llm", "max_batch_size": 4, "max_input_len": 512, "max_seq_len": 1024, "max_num_tokens": 2048},
    "openvino": {
        "backend": "openvino",
        "max_batch_size": 4,
        "max_input_len": 512,
        "max_seq_len": 1024,
        "max_num_tokens": 1024,
        "cpu_inference_precision": "f32",
    },
}
HARDWARE = {"tensorrt-llm": "H100-SXM", "openvino": "cpu"}


def checkpoint(directory: Path, **declared) -> Path:
    return write_checkpoint_config(directory, **declared)


def config_for(source: str | Path, backend: str, dtype: str = "auto") -> ForgeConfig:
    return ForgeConfig.model_validate(
        {
            "name": "dtype",
            "model": {"source": str(source), "family": "llama", "dtype": dtype},
            "engine": ENGINES[backend],
            "hardware": {"gpu": HARDWARE[backend]},
        }
    )


@pytest.mark.parametrize("backend", sorted(ENGINES))
def test_auto_reads_the_checkpoint_and_an_explicit_dtype_wins(tmp_path, backend):
    fp16 = checkpoint(tmp_path / "fp16", torch_dtype="float16")
    assert resolve_model_dtype(config_for(fp16, backend)) == "float16"
    assert resolve_model_dtype(config_for(fp16, backend, "float32")) == "float32"
    # transformers >= 4.56 writes `dtype`; it wins over a stale `torch_dtype`.
    both = checkpoint(tmp_path / "both", dtype="bfloat16", torch_dtype="float16")
    assert resolve_model_dtype(config_for(both, backend)) == "bfloat16"


@pytest.mark.parametrize("backend", sorted(ENGINES))
def test_auto_without_a_readable_checkpoint_takes_the_engine_default(tmp_path, backend):
    default = engine_of(backend).default_dtype
    assert resolve_model_dtype(config_for(tmp_path / "elsewhere", backend)) == default
    assert resolve_model_dtype(config_for(checkpoint(tmp_path / "f64", torch_dtype="float64"), backend)) == default
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    assert resolve_model_dtype(config_for(broken, backend)) == default


@pytest.mark.parametrize("backend", sorted(ENGINES))
def test_gguf_sources_are_float32_and_the_imported_checkpoint_wins(tmp_path, backend):
    assert resolve_model_dtype(config_for("smollm2-135m", backend)) == "float32"
    assert resolve_model_dtype(config_for(tmp_path / "model.Q4_1.gguf", backend)) == "float32"
    source = checkpoint(tmp_path / "source", torch_dtype="bfloat16")
    imported = checkpoint(tmp_path / "imported", dtype="float16")
    assert resolve_model_dtype(config_for(source, backend), imported) == "float16"
    # An imported directory that does not say falls back to model.source.
    assert resolve_model_dtype(config_for(source, backend), tmp_path / "missing") == "bfloat16"


def test_stored_dtype_falls_back_to_the_weights():
    assert stored_dtype({"torch_dtype": "float16"}, {"bfloat16": 10}) == "float16"
    assert stored_dtype({}, {"bfloat16": 10, "float32": 3}) == "bfloat16"
    assert stored_dtype({}, {}) == "unknown"


def _invoke(*args: str) -> dict:
    result = CliRunner().invoke(cli, list(args))
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.mark.parametrize("backend", sorted(ENGINES))
def test_plan_and_build_engine_agree_on_an_auto_fp16_checkpoint(tmp_path, backend):
    """The planner used to assume bfloat16 on TensorRT-LLM (float32 on OpenVINO) while the builders read the
    checkpoint's float16: `plan` sized 2-byte weights of the wrong type, or 4-byte weights that build as fp16."""
    hf = checkpoint(tmp_path / "hf", torch_dtype="float16")
    path = tmp_path / "fp16.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": "fp16",
                "model": {"source": str(hf), "family": "llama"},
                "engine": ENGINES[backend],
                "hardware": {"gpu": HARDWARE[backend]},
            }
        )
    )
    workdir = str(tmp_path / "wd")
    planned = _invoke("plan", str(path), "--json", "--no-plot", "--workdir", workdir)["quantization"]["dtype"]
    build = _invoke("build-engine", str(path), "--dry-run", "--json", "--workdir", workdir)
    built = build["plan"]["dtype"] if backend == "tensorrt-llm" else build["export"]["dtype"]
    assert planned == built == "float16"
