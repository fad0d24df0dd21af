"""The versioned spec data and the argv parser built from its trtllm-build flag table."""

from __future__ import annotations

import json

import pytest
from trtllm_forge.builders.tensorrt_llm.plan import plan_build
from trtllm_forge.builders.tensorrt_llm.spec import load_spec
from trtllm_helpers import ENGINE_CONFIGS, eagle_engine_example, example

from trtllm_forge.errors import ConfigError

SPEC = load_spec("1.2.1")


def test_spec_is_versioned_package_data():
    assert SPEC.version == "1.2.1"
    assert "1.2.0" in SPEC.compatible_versions
    # The build image is ours (trtllm-forge inside) on the newest NGC image that ships 1.2.1 (spec/serving-images.json).
    assert SPEC.container_image == "trtllm-forge:0.1.0-trtllm1.2.1"
    assert SPEC.base_image == "nvcr.io/nvidia/tritonserver:26.07-trtllm-python-py3"
    flags = SPEC.flags("trtllm-build")
    assert len(flags) == 67
    assert flags["--gemm_plugin"].choices == ("auto", "float16", "float32", "bfloat16", "int32", "fp8", "nvfp4", "disable")
    assert flags["--gather_generation_logits"].deprecated


def test_unknown_version_is_a_config_error():
    with pytest.raises(ConfigError, match=r"engine.trtllm_version"):
        load_spec("1.2.7")
    with pytest.raises(ConfigError, match=r"no spec for TensorRT-LLM 0.9"):
        load_spec("0.9.0")


@pytest.mark.parametrize("config_path", [*ENGINE_CONFIGS, "eagle-engine"], ids=lambda p: getattr(p, "stem", p))
def test_every_generated_argv_parses_with_the_spec_parser(config_path):
    config = eagle_engine_example() if config_path == "eagle-engine" else example(config_path)
    plan = plan_build(config)
    build_steps = [s for s in plan.steps if s.tool == "trtllm-build"]
    assert build_steps, "every engine plan ends with trtllm-build"
    parser = SPEC.parser("trtllm-build")
    for step in build_steps:
        parsed = parser.parse(step.argv[1:])
        assert parsed.values["checkpoint_dir"].endswith("checkpoint")
        assert parsed.values["max_batch_size"] == config.engine.max_batch_size
        # values typed by the table: ints are ints, choices are in the table
        assert isinstance(parsed.values["max_seq_len"], int)
    for step in plan.steps:
        if step.tool in ("quantize.py", "convert_checkpoint.py", "qwen/convert_checkpoint.py", "eagle/convert_checkpoint.py"):
            SPEC.parser(step.tool).parse(step.argv[2:])


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (
            ["--checkpoint_dir", "c", "--tp_size", "2"],
            "--tp_size does not exist in TensorRT-LLM 1.2.x; parallelism comes from the checkpoint",
        ),
        (["--checkpoint_dir", "c", "--max_output_len", "10"], "use --max_seq_len"),
        (["--checkpoint_dir", "c", "--gemm_plugn", "auto"], "did you mean --gemm_plugin?"),
        (["--gemm_plugin", "int4"], "--gemm_plugin takes one of auto, float16"),
        (["--max_batch_size", "many"], "invalid int value"),
        (["--kv_cache_type", "ring"], "--kv_cache_type takes one of continuous, paged, disabled"),
        (["--use_paged_context_fmha", "yes"], "takes one of enable, disable"),
        (["--lora_target_modules", "attn_q", "ffn_up"], "invalid choice: 'ffn_up'"),
        (["--streamingllm", "enable"], "--streamingllm takes one of disable"),
    ],
)
def test_out_of_spec_flags_and_values_refused_with_one_line(argv, fragment):
    with pytest.raises(ConfigError) as info:
        SPEC.parser("trtllm-build").parse(argv)
    message = info.value.format_message()
    assert fragment in message
    assert "\n" not in message and message.startswith("trtllm-build: ")


def test_deprecated_flag_is_reported_not_hidden():
    parsed = SPEC.parser("trtllm-build").parse(["--checkpoint_dir", "c", "--gather_generation_logits", "--paged_kv_cache", "enable"])
    assert parsed.deprecated_used == ["--gather_generation_logits", "--paged_kv_cache"]


def test_quantize_py_table_refuses_unknown_qformat():
    with pytest.raises(ConfigError, match="--qformat takes one of"):
        SPEC.parser("quantize.py").parse(["--model_dir", "m", "--qformat", "int3"])


def test_spec_file_is_our_trimmed_json():
    from importlib import resources

    raw = json.loads(resources.files("trtllm_forge.builders.tensorrt_llm").joinpath("spec/trtllm-1.2.json").read_text())
    assert raw["schema"] == 1
    assert "help_summary" not in json.dumps(raw)  # trimmed to the facts we use
