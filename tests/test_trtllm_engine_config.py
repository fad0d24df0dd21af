"""The engine config.json contract as the builder predicts it, and the local calibration data it prepares."""

from __future__ import annotations

import json

import pytest
from trtllm_forge.builders.tensorrt_llm.calibration import prepare_calibration
from trtllm_forge.builders.tensorrt_llm.engine_fixture import expected_engine_config
from trtllm_forge.builders.tensorrt_llm.plan import plan_build
from trtllm_forge.builders.tensorrt_llm.spec import load_spec
from trtllm_helpers import ENGINE_CONFIGS, eagle_engine_example, example

from trtllm_forge.engine_config import read_engine_config
from trtllm_forge.errors import ConfigError

SPEC = load_spec()


@pytest.mark.parametrize("config_path", ENGINE_CONFIGS, ids=lambda p: p.stem)
def test_expected_engine_config_has_the_spec_keys_and_reads_back(tmp_path, config_path):
    config = example(config_path)
    plan = plan_build(config)
    data = expected_engine_config(plan)
    assert set(data) == {"version", "pretrained_config", "build_config"}
    assert set(data["build_config"]) == set(SPEC.engine_config["build_config_keys"])
    assert set(data["build_config"]["plugin_config"]) == set(SPEC.engine_config["plugin_config_keys"])
    assert set(data["pretrained_config"]["mapping"]) == set(SPEC.engine_config["mapping_keys"])
    (tmp_path / "config.json").write_text(json.dumps(data))
    info = read_engine_config(tmp_path)
    assert info.version == "1.2.1"
    assert info.tp_size == config.parallel.tp and info.world_size == config.parallel.world_size
    assert info.max_batch_size == config.engine.max_batch_size
    assert info.max_seq_len == plan.effective.max_seq_len >= config.engine.max_seq_len
    assert info.max_draft_len == plan.effective.max_draft_len
    assert info.paged_kv_cache and info.tokens_per_block == config.engine.tokens_per_block
    assert info.use_paged_context_fmha == plan.effective.toggles["use_paged_context_fmha"]


def test_expected_engine_config_values_for_the_examples():
    by_name = {p.stem: plan_build(example(p)) for p in ENGINE_CONFIGS}
    eagle = expected_engine_config(plan_build(eagle_engine_example()))
    assert eagle["build_config"]["speculative_decoding_mode"] == 32
    assert eagle["build_config"]["max_seq_len"] == 8192 + 63 + 4
    assert eagle["pretrained_config"]["architecture"] == "EagleForCausalLM"
    awq = expected_engine_config(by_name["mistral-7b-int4awq-a10g"])
    assert awq["pretrained_config"]["quantization"]["quant_algo"] == "W4A16_AWQ"
    assert awq["pretrained_config"]["quantization"]["kv_cache_quant_algo"] == "INT8"
    assert awq["build_config"]["plugin_config"]["use_paged_context_fmha"] is False
    assert awq["build_config"]["plugin_config"]["weight_only_groupwise_quant_matmul_plugin"] == "float16"
    moe = expected_engine_config(by_name["mixtral-8x7b-fp16-h100x8-ep"])
    assert moe["pretrained_config"]["mapping"]["moe_ep_size"] == 8 and moe["pretrained_config"]["mapping"]["moe_tp_size"] == 1
    assert moe["pretrained_config"]["moe"]["num_experts"] == 8
    fp8 = expected_engine_config(by_name["llama3.1-70b-fp8-h200-tp4"])
    assert fp8["build_config"]["plugin_config"]["reduce_fusion"] is True
    assert fp8["build_config"]["plugin_config"]["use_fp8_context_fmha"] is True
    assert fp8["build_config"]["plugin_config"]["nccl_plugin"] == "bfloat16"
    draft = expected_engine_config(by_name["qwen2.5-7b-fp16-l40s-tp2"])
    assert draft["build_config"]["gather_generation_logits"] is True
    assert draft["build_config"]["speculative_decoding_mode"] == 2


def test_prepare_calibration_from_jsonl_and_text(tmp_path):
    jsonl = tmp_path / "samples.jsonl"
    jsonl.write_text("\n".join(json.dumps({"text": f"sample {i}"}) for i in range(10)) + "\n")
    out = tmp_path / "calibration" / "train.jsonl"
    assert prepare_calibration(jsonl, out, 4) == 4
    assert [json.loads(line)["text"] for line in out.read_text().splitlines()] == [f"sample {i}" for i in range(4)]
    text = tmp_path / "corpus.txt"
    text.write_text("first paragraph\nstill first\n\nsecond paragraph\n")
    assert prepare_calibration(text, out, 100) == 2
    assert json.loads(out.read_text().splitlines()[0])["text"] == "first paragraph\nstill first"


@pytest.mark.parametrize(
    "content, suffix, fragment",
    [
        (None, ".jsonl", "does not exist"),
        ("", ".jsonl", "holds no samples"),
        ('{"title": "x"}\n', ".jsonl", "no text field"),
        ("not json\n", ".jsonl", "not a JSON object"),
    ],
)
def test_prepare_calibration_refuses_bad_input(tmp_path, content, suffix, fragment):
    source = tmp_path / f"data{suffix}"
    if content is not None:
        source.write_text(content)
    with pytest.raises(ConfigError, match=fragment):
        prepare_calibration(source, tmp_path / "out" / "train.jsonl", 8)
