"""The OpenVINO (CPU) engine builder: quantization mapping, dry run, a real fp32 and int8 export, caching."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_inprocess import run_in_process
from conftest import CONFIGS, cpu_test_config
from tiny_checkpoint import write_tiny_model
from trtllm_forge.builders.openvino.plan import plan_export

from trtllm_forge.engine_config import read_engine_config
from trtllm_forge.errors import ConfigError

CONFIG = CONFIGS / "smollm2-cpu.yaml"


def _plan(tmp_path: Path, **sections):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir(exist_ok=True)
    (ckpt / "config.json").write_text(json.dumps({"dtype": "float32"}))
    return plan_export(cpu_test_config(**sections), ckpt, tmp_path / "out")


@pytest.mark.parametrize(
    ("algorithm", "weight_format", "quant_algo", "extra"),
    [
        ("none", "fp32", None, []),
        ("int8_wo", "int8", "W8A16", []),
        ("int4_wo", "int4", "W4A16", ["--group-size", "64"]),
        ("int4_awq", "int4", "W4A16_AWQ", ["--group-size", "64", "--awq"]),
    ],
)
def test_quantization_maps_to_weight_format(tmp_path, algorithm, weight_format, quant_algo, extra):
    plan = _plan(tmp_path, quantization={"algorithm": algorithm, "group_size": 64})
    assert plan.weight_format == weight_format
    assert plan.quant_algo == quant_algo
    argv = plan.argv
    assert argv[argv.index("--weight-format") + 1] == weight_format
    for flag in extra:
        assert flag in argv
    assert argv[-1] == str(tmp_path / "out")
    assert plan.properties() == {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32"}


def test_fp16_model_dtype_and_int8_kv_cache(tmp_path):
    plan = _plan(tmp_path, model={"dtype": "float16"}, quantization={"kv_cache": "int8"})
    assert plan.weight_format == "fp16"
    assert plan.kv_cache_precision == "u8"
    assert plan.kv_cache_quant_algo == "INT8"


def test_bf16_activations_get_a_bf16_kv_cache(tmp_path):
    # The CPU plugin rejects bf16 activations with an f32 KV cache.
    plan = _plan(tmp_path, engine={"cpu_inference_precision": "bf16"})
    assert plan.properties() == {"INFERENCE_PRECISION_HINT": "bf16", "KV_CACHE_PRECISION": "bf16"}


def test_awq_with_local_calibration_file_uses_our_exporter(tmp_path):
    calib = tmp_path / "calib.txt"
    calib.write_text("The quick brown fox.\n")
    plan = _plan(tmp_path, quantization={"algorithm": "int4_awq", "group_size": 64, "calibration": {"dataset": str(calib)}})
    assert "trtllm_forge.builders.openvino.calibrated_export" in plan.argv
    assert str(calib) in plan.argv


def test_missing_calibration_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match=r"calibration.dataset"):
        _plan(tmp_path, quantization={"algorithm": "int4_awq", "calibration": {"dataset": str(tmp_path / "nope.txt")}})


def test_dry_run_prints_the_export_and_writes_nothing(tmp_path):
    workdir = tmp_path / "wd"
    proc = run_in_process("build-engine", str(CONFIG), "--workdir", str(workdir), "--checkpoint", str(tmp_path / "ckpt"), "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert "optimum-cli export openvino" in proc.stderr
    assert "--weight-format fp32" in proc.stderr
    assert str(workdir / "build" / "engine" / "config.json") in proc.stderr
    assert not workdir.exists()

    proc = run_in_process("build-engine", str(CONFIG), "--workdir", str(workdir), "--dry-run", "--json")
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert plan["dry_run"] is True
    assert plan["engine_dir"] == str(workdir / "build" / "engine")
    assert plan["commands"][0][-1] == str(workdir / "build" / "engine")
    assert not workdir.exists()


def test_missing_checkpoint_is_exit_2(tmp_path):
    proc = run_in_process("build-engine", str(CONFIG), "--workdir", str(tmp_path / "wd"))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert lines[-1].startswith("error: build.checkpoint:") and "trtllm-forge import" in lines[-1]
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_fp32_build_writes_ir_tokenizer_and_engine_config(cpu_engine_fp32):
    from importlib import metadata

    _, result = cpu_engine_fp32
    engine_dir = Path(result.manifest["outputs"]["engine_dir"])
    for name in (
        "openvino_model.xml",
        "openvino_model.bin",
        "openvino_tokenizer.xml",
        "openvino_detokenizer.xml",
        "tokenizer.json",
        "tokenizer_config.json",
        "hf_config.json",
    ):
        assert (engine_dir / name).is_file(), name
    info = read_engine_config(engine_dir)
    cfg = cpu_test_config()
    assert info.backend == "openvino"
    assert info.version == metadata.version("openvino-genai")
    assert (info.max_batch_size, info.max_input_len, info.max_seq_len, info.max_num_tokens) == (
        cfg.engine.max_batch_size,
        cfg.engine.max_input_len,
        cfg.engine.max_seq_len,
        cfg.engine.max_num_tokens,
    )
    assert info.tokens_per_block == cfg.engine.tokens_per_block
    assert info.paged_kv_cache and info.use_paged_context_fmha and info.max_beam_width == 1
    assert (info.vocab_size, info.world_size, info.architecture) == (49152, 1, "LlamaForCausalLM")
    assert info.raw["pretrained_config"]["num_key_value_heads"] == 3
    assert info.raw["openvino"]["weight_format"] == "fp32"
    assert info.raw["openvino"]["properties"]["INFERENCE_PRECISION_HINT"] == "f32"
    assert result.manifest["commands"][0]["returncode"] == 0
    assert Path(result.manifest["commands"][0]["log"]).is_file()


@pytest.mark.slow
def test_unchanged_second_build_is_skipped(cpu_engine_fp32, smollm2_checkpoint):
    from trtllm_forge.builders.openvino.builder import build_engine

    workdir, first = cpu_engine_fp32
    model_bin = Path(first.manifest["outputs"]["engine_dir"]) / "openvino_model.bin"
    before = model_bin.stat().st_mtime_ns
    again = build_engine(cpu_test_config(), workdir, smollm2_checkpoint)
    assert again.skipped
    assert again.manifest["input_hash"] == first.manifest["input_hash"]
    assert model_bin.stat().st_mtime_ns == before


@pytest.mark.slow
def test_a_build_with_the_same_export_settings_reuses_the_export(cpu_engine_fp32, cpu_engine_llmapi):
    """cpu_engine_llmapi starts from a copy of the fp32 build's workdir and switches engine.target to llmapi: the
    export is linked, not run again, and the engine config is written anew; the fp32 build is left as it was."""
    (_, fp32), (_, llmapi) = cpu_engine_fp32, cpu_engine_llmapi
    fp32_dir, llmapi_dir = Path(fp32.manifest["outputs"]["engine_dir"]), Path(llmapi.manifest["outputs"]["engine_dir"])
    assert not llmapi.skipped and llmapi.manifest["outputs"]["export_reused"]
    assert not fp32.manifest["outputs"]["export_reused"]
    assert llmapi.manifest["outputs"]["export_key"] == fp32.manifest["outputs"]["export_key"]
    assert llmapi.manifest["commands"] == []
    assert any("export reused" in note for note in llmapi.manifest["notes"])
    assert (llmapi_dir / "openvino_model.bin").samefile(fp32_dir / "openvino_model.bin")
    assert json.loads((llmapi_dir / "hf_config.json").read_text()) == json.loads((fp32_dir / "hf_config.json").read_text())
    assert Path(llmapi.manifest["outputs"]["model_yaml"]).is_file()
    assert read_engine_config(llmapi_dir).raw["build_config"] == read_engine_config(fp32_dir).raw["build_config"]
    assert read_engine_config(fp32_dir).architecture == "LlamaForCausalLM"


def test_reuse_needs_the_same_export_key(tmp_path):
    from trtllm_forge.builders.cpu_export import EXPORT_KEY, export_key, reuse_previous_export

    settings, tools, inputs = {"weight_format": "fp32", "argv": ["a"]}, {"openvino": "1"}, {"checkpoint": "c0"}
    key = export_key(settings, tools, inputs)
    assert key == export_key({**settings, "argv": ["b"]}, tools, inputs)  # paths in the argv do not matter
    for other in (
        export_key({**settings, "weight_format": "int8"}, tools, inputs),
        export_key(settings, {"openvino": "2"}, inputs),
        export_key(settings, tools, {"checkpoint": "c1"}),
    ):
        assert other != key
    stage = tmp_path / "build"
    (stage / "engine").mkdir(parents=True)
    for name in ("openvino_model.bin", "config.json", "hf_config.json"):
        (stage / "engine" / name).write_text(name)
    (stage / "manifest.json").write_text(json.dumps({"outputs": {EXPORT_KEY: key}}))
    assert reuse_previous_export(stage, export_key(settings, tools, {"checkpoint": "c1"}), tmp_path / "a", ()) is None
    assert not (tmp_path / "a").exists()
    assert reuse_previous_export(stage, key, tmp_path / "b", exclude=("config.json",)) == stage / "engine"
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == ["hf_config.json", "openvino_model.bin"]


@pytest.mark.slow
def test_int8_export_is_smaller(smollm2_checkpoint, tmp_path):
    """int8_wo on a tiny model of SmolLM2's shape (a third of the export's time on SmolLM2 itself): the weights
    that matter for the ratio (all matmuls and the embedding) are there, the layers are few."""
    from trtllm_forge.builders.openvino.builder import build_engine

    checkpoint = write_tiny_model(tmp_path / "tiny", like=smollm2_checkpoint)
    result = build_engine(cpu_test_config(quantization={"algorithm": "int8_wo"}), tmp_path / "wd", checkpoint)
    # An fp32 export carries the fp32 weights as they are: its openvino_model.bin is the safetensors' size (12.88 MB
    # both for this model), so the checkpoint stands in for a second export.
    fp32_size = (checkpoint / "model.safetensors").stat().st_size
    int8_dir = Path(result.manifest["outputs"]["engine_dir"])
    assert (int8_dir / "openvino_model.bin").stat().st_size < 0.4 * fp32_size
    info = read_engine_config(int8_dir)
    assert info.raw["pretrained_config"]["quantization"]["quant_algo"] == "W8A16"
    assert info.raw["openvino"]["weight_format"] == "int8"
    # Another engine limit in the same workdir: the int8 export is reused, the engine config follows the new limit.
    resized = build_engine(
        cpu_test_config(quantization={"algorithm": "int8_wo"}, engine={"max_batch_size": 3}), tmp_path / "wd", checkpoint
    )
    assert resized.manifest["outputs"]["export_reused"] and resized.manifest["commands"] == []
    assert read_engine_config(int8_dir).max_batch_size == 3
    assert read_engine_config(int8_dir).raw["openvino"]["weight_format"] == "int8"


def test_calibration_file_formats(tmp_path):
    from trtllm_forge.builders.openvino.calibrated_export import read_samples

    jsonl = tmp_path / "calib.jsonl"
    jsonl.write_text('{"text": "first sample"}\n\n{"text": "second sample"}\n{"other": 1}\n')
    assert read_samples(jsonl, 10) == ["first sample", "second sample"]
    paragraphs = tmp_path / "calib.txt"
    paragraphs.write_text("one\nstill one\n\ntwo\n\nthree\n")
    assert read_samples(paragraphs, 2) == ["one\nstill one", "two"]
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    with pytest.raises(SystemExit, match="no calibration samples"):
        read_samples(empty, 10)
