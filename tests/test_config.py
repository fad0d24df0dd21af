"""The config file: schema, friendly errors, example configs, and one test per cross-field rule."""

from __future__ import annotations

import json
import textwrap

import pytest
import yaml
from cli_inprocess import run_in_process
from conftest import CONFIGS
from tiny_checkpoint import write_checkpoint_config

from trtllm_forge.config import load_config
from trtllm_forge.config.checks import RULES
from trtllm_forge.config.load import parse_config
from trtllm_forge.errors import ConfigErrors

EXAMPLES = sorted(CONFIGS.glob("*.yaml"))
GPU_EXAMPLES = [p for p in EXAMPLES if "cpu" not in p.stem]


def test_examples_exist():
    names = {p.name for p in EXAMPLES}
    assert "smollm2-cpu.yaml" in names
    assert len(GPU_EXAMPLES) >= 5


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_configs_validate(path):
    config = load_config(path)
    assert config.name == path.stem


def test_gpu_example_names_follow_model_quant_gpu():
    for path in GPU_EXAMPLES:
        config = load_config(path)
        assert config.engine.backend == "tensorrt-llm"
        assert config.hardware.gpu.lower().split("-")[0] in path.stem.lower()


def test_validate_cli_all_examples():
    result = run_in_process("config", "validate", *map(str, EXAMPLES), "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert [r["valid"] for r in doc["results"]] == [True] * len(EXAMPLES)


def test_show_prints_resolved_defaults():
    result = run_in_process("config", "show", str(CONFIGS / "smollm2-cpu.yaml"), "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["runtime"]["exclude_input_in_output"] is True
    assert doc["triton"]["bind_address"] == "127.0.0.1"
    assert doc["model"]["trust_remote_code"] is False
    yaml_out = run_in_process("config", "show", str(CONFIGS / "smollm2-cpu.yaml"))
    assert yaml.safe_load(yaml_out.stdout)["engine"]["backend"] == "openvino"


def test_schema_has_descriptions_for_every_field():
    result = run_in_process("config", "schema")
    assert result.returncode == 0
    schema = json.loads(result.stdout)
    missing = []
    for name, definition in schema["$defs"].items():
        for field, spec in definition.get("properties", {}).items():
            if "description" not in spec:
                missing.append(f"{name}.{field}")
    assert not missing, missing
    assert "config_dir" not in schema["properties"]


# --- errors: one line, field named, exit 2, no traceback -------------------------------------------


def _assert_one_line_error(result, *needles):
    assert result.returncode == 2, (result.returncode, result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) >= 1
    assert all(line.startswith("error: ") for line in lines), result.stderr
    assert "Traceback" not in result.stderr
    for needle in needles:
        assert needle in result.stderr, result.stderr


def test_unknown_key_suggests_nearest(write_config):
    path = write_config("model: {source: smollm2-135m}\nengine: {backend: openvino, max_batch_siz: 4}\n")
    _assert_one_line_error(run_in_process("config", "validate", str(path)), "engine.max_batch_siz", "did you mean 'max_batch_size'")


def test_unknown_section_suggests_nearest(write_config):
    path = write_config(
        "model: {source: smollm2-135m}\nquantisation: {algorithm: none}\nhardware: {gpu: cpu}\nengine: {backend: openvino}\n"
    )
    _assert_one_line_error(run_in_process("config", "validate", str(path)), "quantisation", "did you mean 'quantization'")


def test_wrong_type(write_config):
    path = write_config("model: {source: smollm2-135m}\nengine: {backend: openvino, max_batch_size: four}\n")
    _assert_one_line_error(run_in_process("config", "validate", str(path)), "engine.max_batch_size", "integer")


def test_invalid_choice_lists_valid_values(write_config):
    path = write_config("model: {source: smollm2-135m}\nquantization: {algorithm: fp7}\n")
    _assert_one_line_error(run_in_process("config", "validate", str(path)), "quantization.algorithm", "fp8")


def test_invalid_yaml_names_the_line(write_config):
    path = write_config("model:\n  source: [unclosed\n")
    _assert_one_line_error(run_in_process("config", "validate", str(path)), "invalid YAML", f"{path}:")


def test_missing_config_file(tmp_path):
    _assert_one_line_error(run_in_process("config", "validate", str(tmp_path / "nope.yaml")), "config file not found")


def test_missing_required_model(write_config):
    path = write_config("engine: {backend: openvino}\n")
    _assert_one_line_error(run_in_process("config", "validate", str(path)), "model: required field is missing")


def test_debug_flag_shows_traceback(write_config):
    path = write_config("model: {source: smollm2-135m}\nengine: {backend: openvino, max_batch_siz: 4}\n")
    result = run_in_process("--debug", "config", "validate", str(path))
    assert result.returncode == 2
    assert "Traceback" in result.stderr


def test_top_level_must_be_mapping(write_config):
    path = write_config("- a\n- b\n")
    _assert_one_line_error(run_in_process("config", "validate", str(path)), "top level is a list")


# --- one test per cross-field rule --------------------------------------------------------------------

CPU_BASE = {"model": {"source": "smollm2-135m"}, "engine": {"backend": "openvino"}, "hardware": {"gpu": "cpu"}}
GPU_BASE = {
    "model": {"source": "/models/Llama-3.1-8B-Instruct", "name": "meta-llama/Llama-3.1-8B-Instruct"},
    "engine": {"backend": "tensorrt-llm", "target": "engine"},  # the engine path's rules (a GPU config defaults to llmapi)
    # Local calibration data, which quantize.py's formats need (builders/tensorrt_llm/rules.py); unused otherwise.
    "quantization": {"calibration": {"dataset": "/data/calibration.jsonl"}},
    "hardware": {"gpu": "H100-SXM"},
}


def merged(base: dict, **sections) -> dict:
    data = json.loads(json.dumps(base))
    for section, values in sections.items():
        if isinstance(values, dict) and isinstance(data.get(section), dict):
            data[section].update(values)
        else:
            data[section] = values
    return data


def errors_of(data: dict) -> list[str]:
    try:
        parse_config(data, name="t")
    except ConfigErrors as exc:
        return [e.format_message() for e in exc.errors]
    return []


def assert_rejected(data: dict, field: str):
    errors = errors_of(data)
    assert any(e.startswith(field) for e in errors), errors


# (rule name, bad config, field named in the error, a good neighbour that passes)
RULE_CASES = {
    "input_within_sequence": (
        merged(CPU_BASE, engine={"backend": "openvino", "max_input_len": 4096, "max_seq_len": 2048}),
        "engine.max_input_len",
        merged(CPU_BASE, engine={"backend": "openvino", "max_input_len": 2048, "max_seq_len": 2048}),
    ),
    "known_hardware": (merged(GPU_BASE, hardware={"gpu": "H900"}), "hardware.gpu", merged(GPU_BASE, hardware={"gpu": "h100 sxm"})),
    "backend_matches_hardware": (merged(GPU_BASE, hardware={"gpu": "cpu"}), "engine.backend", GPU_BASE),
    "trtllm_serve_needs_llmapi": (
        merged(GPU_BASE, deploy={"server": "trtllm-serve"}),
        "deploy.server",
        merged(GPU_BASE, engine={"backend": "tensorrt-llm", "target": "llmapi"}, deploy={"server": "trtllm-serve"}),
    ),
    "dynamo_config_problems": (
        merged(GPU_BASE, engine={"backend": "tensorrt-llm", "target": "engine"}, deploy={"server": "dynamo"}),
        "engine.target",
        merged(
            GPU_BASE,
            engine={"backend": "tensorrt-llm", "target": "llmapi"},
            deploy={"server": "dynamo"},
            runtime={"enable_kv_cache_reuse": True},
        ),
    ),
    "dynamo_bench_is_openai": (
        merged(
            GPU_BASE,
            engine={"backend": "tensorrt-llm", "target": "llmapi"},
            deploy={"server": "dynamo"},
            bench={"workloads": [{"name": "w", "target": "triton-grpc"}]},
        ),
        "bench.workloads[0].target",
        merged(
            GPU_BASE,
            engine={"backend": "tensorrt-llm", "target": "llmapi"},
            deploy={"server": "dynamo"},
            runtime={"enable_kv_cache_reuse": True},
            bench={"workloads": [{"name": "w", "target": "openai"}]},
        ),
    ),
    "trtllm_serve_bench_is_openai": (
        merged(
            GPU_BASE,
            engine={"backend": "tensorrt-llm", "target": "llmapi"},
            deploy={"server": "trtllm-serve"},
            bench={"workloads": [{"name": "w", "target": "triton-grpc"}]},
        ),
        "bench.workloads[0].target",
        merged(
            GPU_BASE,
            engine={"backend": "tensorrt-llm", "target": "llmapi"},
            deploy={"server": "trtllm-serve"},
            bench={"workloads": [{"name": "w", "target": "openai"}, {"name": "unset"}]},
        ),
    ),
    "llm_api_options_known": (
        merged(GPU_BASE, engine={"backend": "tensorrt-llm", "target": "llmapi", "extra_llm_api_options": {"max_num_token": 8}}),
        "engine.extra_llm_api_options",
        merged(CPU_BASE, engine={"backend": "openvino", "target": "llmapi", "extra_llm_api_options": {"max_num_tokens": 8}}),
    ),
    "family_matches_checkpoint": (
        merged(GPU_BASE, model={**GPU_BASE["model"], "family": "qwen2"}),
        "model.family",
        merged(GPU_BASE, model={**GPU_BASE["model"], "family": "llama"}),
    ),
    "heads_divisible_by_tp": (
        merged(CPU_BASE, engine={"backend": "tensorrt-llm"}, hardware={"gpu": "L4"}, parallel={"tp": 2}),
        "parallel.tp",
        merged(CPU_BASE, engine={"backend": "tensorrt-llm"}, hardware={"gpu": "L4"}, parallel={"tp": 3}),
    ),
    "seq_len_within_positions": (
        merged(CPU_BASE, engine={"backend": "openvino", "max_seq_len": 16384}),
        "engine.max_seq_len",
        merged(
            CPU_BASE,
            engine={"backend": "openvino", "max_seq_len": 16384},
            model={"source": "smollm2-135m", "rope_scaling": {"rope_type": "linear", "factor": 2.0}},
        ),
    ),
    "backend_rules": (
        merged(GPU_BASE, quantization={"algorithm": "fp8"}, hardware={"gpu": "A100-80GB"}),
        "quantization.algorithm",
        merged(GPU_BASE, quantization={"algorithm": "fp8"}, hardware={"gpu": "L40S"}),
    ),
    "cpu_backend_supports": (
        merged(CPU_BASE, quantization={"algorithm": "fp8"}),
        "quantization.algorithm",
        merged(CPU_BASE, quantization={"algorithm": "int8_wo"}),
    ),
    "int4_group_divides_hidden": (
        merged(CPU_BASE, quantization={"algorithm": "int4_wo", "group_size": 128}),
        "quantization.group_size",
        merged(CPU_BASE, quantization={"algorithm": "int4_wo", "group_size": 64}),
    ),
    "speculative_needs_draft": (
        merged(GPU_BASE, engine={"backend": "tensorrt-llm", "speculative": {"mode": "draft_target", "max_draft_len": 4}}),
        "engine.speculative.draft_model",
        merged(
            GPU_BASE, engine={"backend": "tensorrt-llm", "speculative": {"mode": "draft_target", "max_draft_len": 4, "draft_model": "/m/d"}}
        ),
    ),
    "speculative_limits": (
        merged(
            GPU_BASE,
            engine={
                "backend": "tensorrt-llm",
                "max_batch_size": 256,
                "max_num_tokens": 512,
                "speculative": {"mode": "lookahead", "max_draft_len": 4},
            },
        ),
        "engine.max_num_tokens",
        merged(
            GPU_BASE,
            engine={
                "backend": "tensorrt-llm",
                "max_batch_size": 256,
                "max_num_tokens": 1280,
                "speculative": {"mode": "lookahead", "max_draft_len": 4},
            },
        ),
    ),
    "reuse_needs_paged_context_fmha": (
        merged(
            GPU_BASE, engine={"backend": "tensorrt-llm", "plugins": {"paged_context_fmha": False}}, runtime={"enable_kv_cache_reuse": True}
        ),
        "runtime.enable_kv_cache_reuse",
        merged(
            GPU_BASE, engine={"backend": "tensorrt-llm", "plugins": {"paged_context_fmha": True}}, runtime={"enable_kv_cache_reuse": True}
        ),
    ),
    "paged_kv_required": (
        merged(GPU_BASE, engine={"backend": "tensorrt-llm", "kv_cache_type": "continuous"}),
        "engine.kv_cache_type",
        merged(
            GPU_BASE,
            engine={"backend": "tensorrt-llm", "kv_cache_type": "continuous"},
            runtime={"batching_strategy": "V1", "streaming": False},
        ),
    ),
    "world_fits_cluster": (
        merged(GPU_BASE, parallel={"tp": 8, "gpus_per_node": 4}),
        "parallel",
        merged(GPU_BASE, parallel={"tp": 8, "gpus_per_node": 8}),
    ),
    "moe_parallel_consistent": (
        merged(
            GPU_BASE, model={"source": "/m/x", "name": "mistralai/Mixtral-8x7B-Instruct-v0.1"}, parallel={"tp": 8, "moe_ep": 4, "moe_tp": 1}
        ),
        "parallel.moe_ep",
        merged(
            GPU_BASE, model={"source": "/m/x", "name": "mistralai/Mixtral-8x7B-Instruct-v0.1"}, parallel={"tp": 8, "moe_ep": 4, "moe_tp": 2}
        ),
    ),
    "streaming_needs_decoupled": (
        merged(CPU_BASE, triton={"decoupled": False}),
        "runtime.streaming",
        merged(CPU_BASE, triton={"decoupled": False}, runtime={"streaming": False}),
    ),
    "gather_logits_needs_trtllm": (
        merged(CPU_BASE, engine={"backend": "openvino", "gather_logits": {"generation": True}}),
        "engine.gather_logits",
        merged(GPU_BASE, engine={"backend": "tensorrt-llm", "gather_logits": {"generation": True}}),
    ),
    "nvidia_llm_api_lint": (
        merged(GPU_BASE, engine={"backend": "tensorrt-llm", "target": "llmapi", "max_seq_len": 8192, "max_num_tokens": 4096}),
        "engine.max_num_tokens",
        merged(
            GPU_BASE,
            engine={"backend": "tensorrt-llm", "target": "llmapi", "max_seq_len": 8192, "max_num_tokens": 4096},
            runtime={"enable_chunked_context": True},
        ),
    ),
    "builtin_source_known": (
        merged(CPU_BASE, model={"source": "smollm3"}),
        "model.source",
        merged(CPU_BASE, model={"source": "./models/smollm3"}),
    ),
}


def test_every_rule_has_a_case():
    assert set(RULES) == set(RULE_CASES)


@pytest.mark.parametrize("rule_name", sorted(RULE_CASES))
def test_rule_rejects_and_neighbour_passes(rule_name):
    bad, field, good = RULE_CASES[rule_name]
    assert_rejected(bad, field)
    assert errors_of(good) == [], errors_of(good)


def test_kv_reuse_impossible_with_int8_kv():
    data = merged(GPU_BASE, quantization={"kv_cache": "int8"}, runtime={"enable_kv_cache_reuse": True})
    assert any("int8 KV cache" in e for e in errors_of(data))


# Each row of config/checks.py's GPU_QUANT_LIMITS: (quantization setting, a GPU that refuses it, one that takes it).
@pytest.mark.parametrize(
    ("quantization", "refused_on", "taken_on"),
    [
        ({"kv_cache": "fp8"}, "A10G", "L40S"),
        ({"algorithm": "int8_wo"}, "B200", "H100-SXM"),
        ({"kv_cache": "int8"}, "GB200", "H100-SXM"),
        ({"algorithm": "nvfp4"}, "H100-SXM", "B200"),
    ],
)
def test_quantization_limit_by_compute_capability(quantization, refused_on, taken_on):
    field = "quantization." + next(iter(quantization))
    assert_rejected(merged(GPU_BASE, quantization=quantization, hardware={"gpu": refused_on}), field)
    assert errors_of(merged(GPU_BASE, quantization=quantization, hardware={"gpu": taken_on})) == []


def test_draft_len_zero_rejected():
    data = merged(GPU_BASE, engine={"backend": "tensorrt-llm", "speculative": {"mode": "eagle", "draft_model": "/m/e"}})
    assert_rejected(data, "engine.speculative.max_draft_len")


def test_rule_on_local_checkpoint_config(tmp_path):
    """Shape rules read a local checkpoint's config.json, which wins over the catalog."""
    write_checkpoint_config(tmp_path / "ckpt", hidden_size=64, num_attention_heads=6, max_position_embeddings=512)
    config_file = tmp_path / "c.yaml"
    config_file.write_text(
        textwrap.dedent("""
        model: {source: ckpt, name: meta-llama/Llama-3.1-8B-Instruct}
        engine: {backend: tensorrt-llm, max_seq_len: 1024, max_input_len: 256}
        parallel: {tp: 4}
        hardware: {gpu: H100-SXM}
    """)
    )
    result = run_in_process("config", "validate", str(config_file))
    assert result.returncode == 2
    assert "parallel.tp: 4 does not divide the model's 6 attention heads" in result.stderr
    assert "engine.max_seq_len: 1024 exceeds the model's max_position_embeddings (512)" in result.stderr
    assert "model.source" not in result.stderr  # a relative directory name is a path, not a built-in


def test_all_problems_reported_at_once(write_config):
    path = write_config(
        textwrap.dedent("""
        model: {source: smollm2-135m}
        engine: {backend: openvino, max_beam_width: 4}
        quantization: {algorithm: fp8}
        hardware: {gpu: cpu}
    """)
    )
    result = run_in_process("config", "validate", str(path))
    assert result.returncode == 2
    assert "quantization.algorithm" in result.stderr and "engine.max_beam_width" in result.stderr
