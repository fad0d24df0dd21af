"""GPU-capability rules and the silent adjustments trtllm-build 1.2.x would make, each checked on its own.

Configs are validated field by field but not by config/checks.py, so the builder's own rules are what
refuses (or warns) here.
"""

from __future__ import annotations

import pytest
from trtllm_forge.builders.tensorrt_llm.plan import plan_build
from trtllm_helpers import unchecked_config

from trtllm_forge.errors import ConfigError

CALIB = {"calibration": {"dataset": "/data/calib.jsonl"}}


def q(algorithm="none", kv_cache="none", **extra):
    return {"algorithm": algorithm, "kv_cache": kv_cache, **CALIB, **extra}


# --- GPU capability ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "gpu, quantization, fragment",
    [
        ("A10G", q("fp8"), "fp8 needs compute capability >= 8.9 but A10G is 8.6"),
        ("A100-80GB", q("w4a8_awq"), "w4a8_awq needs compute capability >= 8.9 but A100-80GB is 8.0"),
        ("A100-80GB", q(kv_cache="fp8"), "fp8 KV cache needs compute capability >= 8.9"),
        ("H100-SXM", q("nvfp4"), "nvfp4 needs compute capability >= 10.0 but H100-SXM is 9.0"),
        ("L40S", q("nvfp4"), "nvfp4 needs compute capability >= 10.0"),
        ("B200", q("int4_awq"), "INT8/INT4 quantization is not supported on SM>=100"),
        ("B200", q("w4a8_awq"), "INT8/INT4 quantization is not supported on SM>=100"),
        ("B200", q("int8_wo"), "INT8/INT4 quantization is not supported on SM>=100"),
        ("GB200", q("int4_wo"), "INT8/INT4 quantization is not supported on SM>=100"),
        ("B200", q("int8_sq"), "SmoothQuant is not supported on SM>=100"),
        ("B200", q(kv_cache="int8"), "int8 KV cache is rejected"),
    ],
)
def test_capability_rules_refuse(gpu, quantization, fragment):
    config = unchecked_config(quantization=quantization, hardware={"gpu": gpu})
    with pytest.raises(ConfigError) as info:
        plan_build(config)
    assert fragment in str(info.value.format_message())
    assert info.value.exit_code == 2


@pytest.mark.parametrize(
    "engine, fragment",
    [
        ({"plugins": {"low_latency_gemm": True}}, "low_latency_gemm_plugin=fp8 is not supported on SM 100"),
        ({"fusion": {"gemm_swiglu": True}}, "gemm_swiglu_plugin=fp8 is not supported on SM 100"),
    ],
)
def test_plugins_rejected_on_sm100(engine, fragment):
    config = unchecked_config(engine=engine, quantization=q("fp8"), hardware={"gpu": "B200"})
    with pytest.raises(ConfigError, match=fragment):
        plan_build(config)
    # the same plugins are fine on Hopper
    plan = plan_build(unchecked_config(engine=engine, quantization=q("fp8"), hardware={"gpu": "H100-SXM"}))
    assert plan.quant.quant_algo == "FP8"


@pytest.mark.parametrize(
    "gpu, quantization, algo",
    [
        ("B200", q("fp8", "fp8"), "FP8"),
        ("B200", q("nvfp4"), "NVFP4"),
        ("L40S", q("fp8"), "FP8"),
        ("A10G", q("int4_awq", "int8"), "W4A16_AWQ"),
        ("A100-80GB", q("int8_sq"), "W8A8_SQ_PER_CHANNEL"),
    ],
)
def test_capability_rules_allow(gpu, quantization, algo):
    assert plan_build(unchecked_config(quantization=quantization, hardware={"gpu": gpu})).quant.quant_algo == algo


def test_several_capability_problems_reported_together():
    config = unchecked_config(quantization=q("int8_sq", "int8"), hardware={"gpu": "B200"})
    with pytest.raises(ConfigError) as info:
        plan_build(config)
    assert [e.where for e in info.value.errors] == ["quantization.algorithm", "quantization.kv_cache"]


# --- silent adjustments --------------------------------------------------------------------------


def codes(plan):
    return {w.code for w in plan.warnings}


@pytest.mark.parametrize(
    "overrides, code, check",
    [
        (
            {"engine": {"plugins": {"context_fmha": False}}},
            "context_fmha_off",
            lambda e: not e.toggles["use_paged_context_fmha"] and not e.toggles["use_fp8_context_fmha"],
        ),
        (
            {"quantization": q(kv_cache="int8"), "hardware": {"gpu": "A100-80GB"}},
            "int8_kv_disables_paged_context_fmha",
            lambda e: not e.toggles["use_paged_context_fmha"],
        ),
        (
            {
                "engine": {
                    "max_num_tokens": 8192,
                    "plugins": {"paged_context_fmha": False},
                    "speculative": {"mode": "eagle", "max_draft_len": 7, "draft_model": "/m/eagle"},
                }
            },
            "eagle_forces_paged_context_fmha",
            lambda e: e.toggles["use_paged_context_fmha"],
        ),
        ({"engine": {"plugins": {"fp8_context_fmha": True}}}, "fp8_context_fmha_off", lambda e: not e.toggles["use_fp8_context_fmha"]),
        (
            {"quantization": q("fp8", "fp8"), "engine": {"plugins": {"fp8_context_fmha": False}}},
            "fp8_kv_forces_fp8_context_fmha",
            lambda e: e.toggles["use_fp8_context_fmha"],
        ),
        ({"quantization": q("int4_awq", "fp8"), "hardware": {"gpu": "L40S"}}, "awq_fp8kv_paged_fmha_kernels", lambda e: True),
        ({"engine": {"fusion": {"reduce_fusion": True}}}, "reduce_fusion_off", lambda e: not e.toggles["reduce_fusion"]),
        ({"engine": {"fusion": {"user_buffer": True}}}, "user_buffer_off", lambda e: not e.toggles["user_buffer"]),
        ({"quantization": q("int8_wo")}, "fused_mlp_off", lambda e: not e.toggles["use_fused_mlp"]),
        (
            {"quantization": q("nvfp4"), "engine": {"plugins": {"gemm": "float16"}}, "hardware": {"gpu": "B200"}},
            "nvfp4_gemm_plugin",
            lambda e: e.plugin_values["gemm_plugin"] == "nvfp4",
        ),
        (
            {"parallel": {"tp": 2}, "engine": {"plugins": {"nccl": "disable"}}},
            "nccl_plugin_forced",
            lambda e: e.plugin_values["nccl_plugin"],
        ),
        ({"engine": {"plugins": {"nccl": "bfloat16"}}}, "nccl_plugin_unused", lambda e: e.plugin_values["nccl_plugin"] is None),
        ({"quantization": q("int4_wo")}, "weight_only_plugins", lambda e: True),
        ({"quantization": q("int8_sq"), "hardware": {"gpu": "A100-80GB"}}, "smoothquant_plugins", lambda e: True),
        (
            {"model": {"name": "mistralai/Mistral-7B-Instruct-v0.3", "family": "mistral"}, "engine": {"max_seq_len": 40000}},
            "max_seq_len_above_positions",
            lambda e: e.max_seq_len == 40000,
        ),
        ({"engine": {"max_input_len": 4096}}, "max_input_len_clipped", lambda e: e.max_input_len == 2048),
        (
            {"engine": {"speculative": {"mode": "draft_target", "max_draft_len": 4, "draft_model": "/m/draft"}}},
            "speculative_extends_max_seq_len",
            lambda e: e.max_seq_len == 2048 + 4 and e.max_draft_len == 4,
        ),
        (
            {"engine": {"max_num_tokens": 8192, "speculative": {"mode": "eagle", "max_draft_len": 7, "draft_model": "/m/eagle"}}},
            "speculative_extends_max_seq_len",
            lambda e: e.max_seq_len == 2048 + 7 + 4,
        ),
        ({"engine": {"plugins": {"remove_input_padding": False}}}, "max_num_tokens_padded", lambda e: e.max_num_tokens == 8 * 2048),
        ({"engine": {"max_batch_size": 64, "max_num_tokens": 32768}}, "max_num_tokens_large", lambda e: e.max_num_tokens == 32768),
        ({"engine": {"max_batch_size": 1, "max_num_tokens": 8192}}, "max_num_tokens_clipped", lambda e: e.max_num_tokens == 2048),
        ({"engine": {"max_num_tokens": 16}}, "max_num_tokens_raised", lambda e: e.max_num_tokens == 32),
        ({"engine": {"max_input_len": 2048, "max_num_tokens": 1024}}, "runtime_input_capped", lambda e: e.runtime_max_input_len == 1024),
    ],
)
def test_each_silent_adjustment_is_warned(overrides, code, check):
    plan = plan_build(unchecked_config(**overrides))
    assert code in codes(plan), sorted(codes(plan))
    assert check(plan.effective)
    # the same baseline without the override raises none of these warnings
    assert code not in codes(plan_build(unchecked_config()))


def test_no_runtime_cap_with_chunked_context():
    plan = plan_build(unchecked_config(engine={"max_input_len": 2048, "max_num_tokens": 1024}, runtime={"enable_chunked_context": True}))
    assert "runtime_input_capped" not in codes(plan)


def test_awq_calibration_size_clamp_warned():
    plan = plan_build(
        unchecked_config(quantization=q("int4_awq", calibration={"dataset": "/d/c.jsonl", "size": 512}), hardware={"gpu": "A10G"})
    )
    assert "awq_calib_size_clamped" in codes(plan)


def test_deprecated_build_flag_warned():
    plan = plan_build(unchecked_config(engine={"gather_logits": {"generation": True}}))
    deprecated = [w for w in plan.warnings if w.code == "deprecated_flag"]
    assert deprecated and "--gather_generation_logits is deprecated in TensorRT-LLM 1.2.1" in deprecated[0].message


def test_calibration_name_quirk_and_local_dataset_required():
    plan = plan_build(unchecked_config(quantization=q("fp8", calibration={"dataset": "/d/cnn_dailymail_512.jsonl"})))
    assert "calibration_name_quirk" in codes(plan)
    quantize = next(s for s in plan.steps if s.tool == "quantize.py")
    assert quantize.argv[quantize.argv.index("--calib_dataset") + 1] == "./calibration"
    assert quantize.env["HF_DATASETS_OFFLINE"] == "1"
    with pytest.raises(ConfigError, match=r"quantization.calibration.dataset: fp8 .* downloaded from a hub"):
        plan_build(unchecked_config(quantization={"algorithm": "fp8"}))


def test_eagle_refuses_quantization_its_converter_cannot_apply():
    with pytest.raises(ConfigError, match=r"quantization.algorithm: NVIDIA's EAGLE converter quantizes only weight-only int8/int4"):
        plan_build(
            unchecked_config(
                quantization=q("fp8", "fp8"),
                engine={"max_num_tokens": 8192, "speculative": {"mode": "eagle", "max_draft_len": 7, "draft_model": "/m/eagle"}},
            )
        )


def test_weight_only_without_kv_uses_convert_checkpoint():
    plan = plan_build(unchecked_config(quantization={"algorithm": "int4_wo"}))
    convert = next(s for s in plan.steps if s.name == "convert")
    assert convert.tool == "convert_checkpoint.py"
    assert convert.argv[-3:] == ["--use_weight_only", "--weight_only_precision", "int4"]
    assert not any(s.name == "prepare-calibration" for s in plan.steps)


def test_unsupported_engine_combinations_refused():
    with pytest.raises(ConfigError, match=r"engine.speculative.mode: medusa engines"):
        plan_build(unchecked_config(engine={"speculative": {"mode": "medusa", "max_draft_len": 4, "draft_model": "/m/medusa"}}))
    with pytest.raises(ConfigError, match=r"parallel.moe_ep: quantize.py .* cannot set expert parallelism"):
        plan_build(
            unchecked_config(
                model={"name": "mistralai/Mixtral-8x7B-Instruct-v0.1", "family": "mixtral"},
                parallel={"tp": 2, "moe_ep": 2, "moe_tp": 1},
                quantization=q("fp8"),
            )
        )


def test_llm_api_equivalent_is_valid_python_with_the_same_settings():
    import ast

    plan = plan_build(unchecked_config(quantization=q("fp8", "fp8"), parallel={"tp": 2}))
    equivalent = plan.llmapi
    ast.parse(equivalent["python"])
    assert "QuantConfig(quant_algo=QuantAlgo.FP8, kv_cache_quant_algo=QuantAlgo.FP8)" in equivalent["python"]
    assert "CalibConfig(calib_dataset='./calibration'" in equivalent["python"]
    kwargs = equivalent["kwargs"]
    assert kwargs["tensor_parallel_size"] == 2 and kwargs["build_config"]["max_batch_size"] == 8
    assert kwargs["build_config"]["plugin_config"]["gemm_plugin"] == "disable"


def _written(tmp_path, source: str, edit) -> str:
    import yaml
    from trtllm_helpers import REPO

    data = yaml.safe_load((REPO / "configs" / source).read_text())
    edit(data)
    path = tmp_path / source
    path.write_text(yaml.safe_dump(data))
    return str(path)


def _drop_calibration(data: dict) -> None:
    data["quantization"].pop("calibration")


def _fp8(data: dict) -> None:
    data["quantization"] = {"algorithm": "fp8", "kv_cache": "fp8", "calibration": {"dataset": "/data/calibration.jsonl"}}


@pytest.mark.parametrize(
    ("source", "edit", "problem"),
    [
        ("llama3.1-70b-fp8-h200-tp4.yaml", _drop_calibration, "quantization.calibration.dataset: fp8 (KV fp8) needs calibration data"),
        ("llama3.1-405b-bf16-h100x16-2node.yaml", _fp8, "onto the GPUs of one node (8 x H100-SXM = 640 GiB): it does not fit"),
    ],
    ids=["fp8-without-calibration", "405b-quantized-on-one-node"],
)
def test_config_validate_refuses_what_the_build_dry_run_refuses(tmp_path, source, edit, problem):
    """One set of rules: `config validate` and `build-engine --dry-run` refuse the same config with the same line."""
    from cli_inprocess import run_in_process

    config = _written(tmp_path, source, edit)
    validated = run_in_process("config", "validate", config)
    planned = run_in_process("build-engine", config, "--dry-run", "--workdir", str(tmp_path / "wd"))
    assert validated.returncode == planned.returncode == 2
    assert problem in validated.stderr and validated.stderr == planned.stderr
    if "does not fit" in problem:
        assert "start from a checkpoint quantized elsewhere" in validated.stderr and "engine.target: llmapi" in validated.stderr


def test_the_plan_raises_the_shared_rules_for_configs_loaded_without_them():
    """plan_build itself refuses (configs built in memory skip the load-time checks)."""
    config = unchecked_config(quantization={"algorithm": "fp8", "kv_cache": "fp8"})
    with pytest.raises(ConfigError, match=r"needs calibration data"):
        plan_build(config)
