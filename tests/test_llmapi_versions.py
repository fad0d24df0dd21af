"""The two LLM-API versions' tables (trtllm_forge/llmapi_args.py TABLES) against NVIDIA's source, rebuilt with ast
from the stored excerpt (tests/fixtures/nvidia_llm_args/, repo@commit:path in its header), and what forge writes per
version: speculative spellings, trtllm-serve's flags, the did-you-mean naming the version that has a key."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml
from trtllm_forge.builders.tensorrt_llm import llmapi, modelopt

from trtllm_forge.config.schema import ForgeConfig
from trtllm_forge.errors import ConfigError
from trtllm_forge.llmapi_args import TABLES, V1_2_1, V1_3, describe, unknown_keys, version_for_server

REPO = Path(__file__).resolve().parents[1]
FIXTURE = REPO / "tests" / "fixtures" / "nvidia_llm_args" / "llm_args.0004396720.py.txt"


def _classes() -> dict[str, tuple[list[str], dict[str, ast.expr]]]:
    """class name → (base names, field name → annotation), fields inherited from bases included."""
    tree = ast.parse(FIXTURE.read_text())
    own: dict[str, tuple[list[str], dict[str, ast.expr]]] = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            fields = {
                item.target.id: item.annotation
                for item in node.body
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
            }
            own[node.name] = ([b.id for b in node.bases if isinstance(b, ast.Name)], fields)

    def merged(name: str) -> dict[str, ast.expr]:
        bases, fields = own[name]
        out: dict[str, ast.expr] = {}
        for base in bases:
            if base in own:
                out.update(merged(base))
        return {**out, **fields}

    return {name: (bases, merged(name)) for name, (bases, _) in own.items()}


def _decoding_types() -> dict[str, set[str]]:
    """decoding_type literal → that config class's fields."""
    out: dict[str, set[str]] = {}
    for _name, (_bases, fields) in _classes().items():
        annotation = fields.get("decoding_type")
        if isinstance(annotation, ast.Subscript) and isinstance(annotation.slice, ast.Constant):
            out[annotation.slice.value] = set(fields)
    return out


def test_the_fixture_names_its_source():
    header = FIXTURE.read_text().splitlines()[:8]
    assert any("NVIDIA/TensorRT-LLM@0004396720054fd8e205cbf616f21f0b57c6b412:tensorrt_llm/llmapi/llm_args.py" in line for line in header)


def test_scheduler_table_of_each_version_is_in_nvidias_scheduler_config():
    scheduler = set(_classes()["SchedulerConfig"][1])
    for table in TABLES.values():
        assert table.nested["scheduler_config"] <= scheduler, table.version
    assert TABLES[V1_3].nested["cuda_graph_config"] <= set(_classes()["DecodeCudaGraphConfig"][1])


@pytest.mark.parametrize("mode", ["eagle", "draft_target", "prompt_lookup"])
def test_the_1_3_speculative_spelling_is_a_decoding_type_of_the_source(mode):
    table = TABLES[V1_3]
    decoding_types = _decoding_types()
    decoding_type = table.decoding_types[mode]
    assert decoding_type in decoding_types, sorted(decoding_types)
    assert {"max_draft_len", table.draft_model_key} <= decoding_types[decoding_type]
    if mode == "eagle":
        assert decoding_type == "Eagle3" and "eagle3_one_model" in decoding_types[decoding_type]


def test_every_source_speculative_field_is_accepted_by_the_1_3_table():
    fields = set().union(*(f for t, f in _decoding_types().items() if t in ("Eagle", "Eagle3", "NGram", "Draft_Target", "MTP")))
    accepted = TABLES[V1_3].nested["speculative_config"]
    missing = (
        fields
        - accepted
        - {
            "sa_config",
            "eagle3_model_arch",
            "mtp_eagle_one_model",
            "begin_thinking_phase_token",
            "end_thinking_phase_token",
            "acceptance_rate_window_size",
            "acceptance_rate_threshold",
            "use_rejection_sampling",
            "allow_advanced_sampling",
            "advanced_sampling_mode",
            "enable_penalty",
        }
    )
    # The set subtracted above: fields of the stored (newer than 1.3.0rc29) source not claimed for 1.3.0rc29.
    assert missing == set()


def _example(**engine: object) -> ForgeConfig:
    data = yaml.safe_load((REPO / "configs" / "llama3.1-8b-fp8-h100.yaml").read_text())
    data["engine"].update(engine)
    return ForgeConfig.model_validate(data)


def test_speculative_config_is_spelled_per_version():
    old = llmapi.llm_api_options(_example(llmapi_version=V1_2_1))["speculative_config"]
    new = llmapi.llm_api_options(_example(llmapi_version=V1_3))["speculative_config"]
    assert old["decoding_type"] == "Eagle" and "speculative_model_dir" in old
    assert new["decoding_type"] == "Eagle3" and "speculative_model" in new and "speculative_model_dir" not in new


def test_default_version_follows_the_server_kind():
    assert version_for_server("triton") == V1_2_1
    assert version_for_server("trtllm-serve") == V1_3 and version_for_server("dynamo") == V1_3


def test_trtllm_serve_uses_the_versions_flag_for_the_options_file():
    old = llmapi.serve_argv(_example(llmapi_version=V1_2_1), "/m", "o.yaml")
    new = llmapi.serve_argv(_example(llmapi_version=V1_3), "/m", "o.yaml")
    assert old[old.index("--extra_llm_api_options") + 1] == "o.yaml" and "--config" not in old
    assert new[new.index("--config") + 1] == "o.yaml" and "--extra_llm_api_options" not in new
    assert not set(new) & TABLES[V1_3].serve_deprecated_flags


def test_a_key_of_the_other_version_is_named_with_that_version():
    [problem] = unknown_keys({"kv_cache_config": {"use_kv_cache_manager_v2": True}}, version=V1_2_1)
    assert problem.other_version == V1_3
    assert "set engine.llmapi_version: 1.3.0rc29" in describe(problem, V1_2_1)
    [problem] = unknown_keys({"build_config": {}}, version=V1_3)
    assert problem.other_version == V1_2_1
    [typo] = unknown_keys({"kv_cache_config": {"enable_block_resue": True}}, version=V1_3)
    assert typo.near == "kv_cache_config.enable_block_reuse" and typo.other_version is None


def test_a_static_choice_tree_is_refused_naming_the_field():
    config = _example(speculative={"mode": "eagle", "max_draft_len": 3, "draft_model": "/d", "choices": "[[0],[0,0]]"})
    with pytest.raises(ConfigError) as error:
        llmapi.llm_api_options(config)
    assert str(error.value).startswith("engine.speculative.choices")


def test_engine_only_fields_are_named_not_dropped():
    data = yaml.safe_load((REPO / "configs" / "llama3.1-8b-fp8-h100.yaml").read_text())
    data["runtime"]["decoding_mode"] = "eagle"
    data["engine"]["plugins"] = {"fp8_context_fmha": True}
    fields = [name for name, _ in llmapi.dropped_field_problems(ForgeConfig.model_validate(data))]
    assert "runtime.decoding_mode" in fields and "engine.plugins.fp8_context_fmha" in fields


def test_a_gpu_config_without_target_gets_the_llm_api_and_cpu_keeps_its_engine():
    gpu = ForgeConfig.model_validate({"model": {"source": "/m"}, "engine": {"backend": "tensorrt-llm"}, "hardware": {"gpu": "H100-SXM"}})
    cpu = ForgeConfig.model_validate({"model": {"source": "/m"}, "engine": {"backend": "openvino"}})
    assert gpu.engine.target == "llmapi" and cpu.engine.target == "engine"


def test_quantization_is_planned_as_a_modelopt_export(tmp_path):
    data = yaml.safe_load((REPO / "configs" / "llama3.1-8b-fp8-h100.yaml").read_text())
    data["quantization"] = {"algorithm": "int4_awq"}
    step = modelopt.plan_quantize(ForgeConfig.model_validate(data), "/m", tmp_path, V1_3)
    assert step is not None and step.quantize_argv[step.quantize_argv.index("--qformat") + 1] == "int4_awq"
    assert step.quantize_argv[step.quantize_argv.index("--export_path") + 1] == str(step.export_dir) and step.export_dir.is_absolute()
