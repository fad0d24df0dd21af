"""`plan` formulas against values computed by hand (shapes from the public config.json files), the worked examples
in the TensorRT-LLM memory notes, and the numbers TensorRT-LLM logged in public issues."""

from __future__ import annotations

import math

import pytest

from trtllm_forge.config.load import parse_config
from trtllm_forge.hardware import Device, link_table
from trtllm_forge.model_shape import catalog_shape
from trtllm_forge.plan.advise import quantization_supported, recommend, refusal
from trtllm_forge.plan.memory import GiB, kv_bytes_per_token, rank_memory
from trtllm_forge.plan.planner import Workload, make_plan
from trtllm_forge.plan.weights import Mapping, parameter_count, rank_weights

LLAMA8 = "meta-llama/Llama-3.1-8B-Instruct"
LLAMA70 = "meta-llama/Llama-3.1-70B-Instruct"
MISTRAL = "mistralai/Mistral-7B-Instruct-v0.3"
MIXTRAL = "mistralai/Mixtral-8x7B-Instruct-v0.1"
QWEN = "Qwen/Qwen2.5-7B-Instruct"
SMOL = "HuggingFaceTB/SmolLM2-135M-Instruct"


def gpu_config(
    model: str,
    gpu: str,
    *,
    algorithm="none",
    kv_cache="none",
    tp=1,
    pp=1,
    dtype="bfloat16",
    max_batch_size=8,
    max_input_len=1024,
    max_seq_len=2048,
    max_num_tokens=8192,
    tokens_per_block=32,
    max_tokens=None,
    fraction=0.9,
    group_size=128,
    target="engine",
    **parallel,
):
    runtime = {"kv_cache_free_gpu_mem_fraction": fraction}
    if max_tokens is not None:
        runtime["max_tokens_in_paged_kv_cache"] = max_tokens
    return parse_config(
        {
            "name": "t",
            "model": {"source": f"/nonexistent/{model.split('/')[1]}", "name": model, "dtype": dtype},
            "engine": {
                "backend": "tensorrt-llm",
                "target": target,
                "max_batch_size": max_batch_size,
                "max_input_len": max_input_len,
                "max_seq_len": max_seq_len,
                "max_num_tokens": max_num_tokens,
                "tokens_per_block": tokens_per_block,
            },
            # Calibration data: quantize.py's formats are refused without it (builders/tensorrt_llm/rules.py).
            "quantization": {
                "algorithm": algorithm,
                "kv_cache": kv_cache,
                "group_size": group_size,
                "calibration": {"dataset": "/data/c.jsonl"},
            },
            "parallel": {"tp": tp, "pp": pp, **parallel},
            "runtime": runtime,
            "hardware": {"gpu": gpu},
        }
    )


# Parameter counts Hugging Face reports for these checkpoints.
@pytest.mark.parametrize(
    "model, published",
    [
        (LLAMA8, 8_030_261_248),
        (LLAMA70, 70_553_706_496),
        (MISTRAL, 7_248_023_552),
        (MIXTRAL, 46_702_792_704),
        (QWEN, 7_615_616_512),
        (SMOL, 134_515_008),
        ("meta-llama/Llama-2-7b-hf", 6_738_415_616),
        ("Qwen/Qwen1.5-7B", 7_721_324_544),
    ],
)
def test_parameter_count_matches_published(model, published):
    assert parameter_count(catalog_shape(model)) == published


# --- KV bytes per token -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "model, tp, pp_layers, kv_bytes, expected",
    [
        (LLAMA8, 1, 32, 2, 2 * 32 * 8 * 128 * 2),  # 128 KiB: the worked example of the memory notes
        (LLAMA8, 1, 32, 1, 64 * 1024),  # FP8 KV: 64 KiB
        (LLAMA8, 2, 32, 2, 64 * 1024),  # TP 2 halves it (4 KV heads per rank)
        (LLAMA70, 1, 80, 2, 320 * 1024),  # 320 KiB
        (LLAMA70, 4, 80, 1, 80 * 2 * 128 * 2 * 1),  # fp8, 2 KV heads per rank
        (LLAMA70, 16, 80, 2, 80 * 1 * 128 * 2 * 2),  # tp > KV heads: one replicated head per rank
        (MISTRAL, 1, 32, 2, 32 * 8 * 128 * 2 * 2),
        (MIXTRAL, 8, 32, 2, 32 * 1 * 128 * 2 * 2),
        (QWEN, 2, 28, 2, 28 * 2 * 128 * 2 * 2),
        (SMOL, 1, 30, 4, 30 * 3 * 64 * 2 * 4),  # fp32 on the CPU: 46080
    ],
)
def test_kv_bytes_per_token(model, tp, pp_layers, kv_bytes, expected):
    assert kv_bytes_per_token(catalog_shape(model), Mapping(tp=tp), pp_layers, kv_bytes) == expected


def test_kv_per_rank_times_tp_matches_trtllm_bench_group_formula():
    # trtllm-bench: bytes per token of the whole TP group = 2 x layers x max(TP, KV heads) x head size x KV bytes
    shape = catalog_shape(LLAMA70)
    for tp in (1, 2, 4, 8, 16, 32):
        group = 2 * 80 * max(tp, 8) * 128 * 2
        assert kv_bytes_per_token(shape, Mapping(tp=tp), 80, 2) * tp == group


def test_llama8_sequence_and_block_sizes_from_memory_notes():
    per_token = kv_bytes_per_token(catalog_shape(LLAMA8), Mapping(), 32, 2)
    assert per_token * 8192 == 1 * GiB  # one 8192-token sequence
    assert per_token * 32 == 4 * 1024**2  # one 32-token block


# --- weights per GPU --------------------------------------------------------------------------------------------


def test_llama8_bf16_weights_are_two_bytes_per_parameter():
    plan = make_plan(gpu_config(LLAMA8, "H100-SXM"))
    assert plan.weights_bytes_per_gpu == 8_030_261_248 * 2


def test_llama8_fp8_keeps_embedding_lm_head_and_norms_in_bf16():
    linear_per_layer = 4096 * 4096 + 2 * 4096 * 1024 + 4096 * 4096 + 3 * 4096 * 14336  # 218,103,808 at 1 byte
    embedding = 128256 * 4096 * 2
    norms = (32 * 2 * 4096 + 4096) * 2
    expected = 32 * linear_per_layer + 2 * embedding + norms
    assert expected == 9_081_200_640
    assert make_plan(gpu_config(LLAMA8, "H100-SXM", algorithm="fp8")).weights_bytes_per_gpu == expected


def test_llama70_fp8_tp4_weights_per_gpu():
    # per rank: q 8192x2048, k/v 8192x256 (2 KV heads), o 2048x8192, MLP 3 x 8192x7168, all at 1 byte
    linear = 8192 * 2048 + 2 * 8192 * 256 + 2048 * 8192 + 3 * 8192 * 7168
    embedding = 128256 * 8192 * 2  # replicated on every TP rank
    lm_head = 128256 // 4 * 8192 * 2  # split over TP
    norms = (80 * 2 * 8192 + 8192) * 2
    expected = 80 * linear + embedding + lm_head + norms
    assert expected == 19_742_081_024
    plan = make_plan(gpu_config(LLAMA70, "H200", algorithm="fp8", kv_cache="fp8", tp=4))
    assert plan.weights_bytes_per_gpu == expected


def test_mistral7b_int4_awq_group_scales():
    def awq(i, o):  # int4 data + one fp16 scale per 128 inputs per output + fp16 pre-quant scale per input
        return i * o // 2 + (i // 128) * o * 2 + i * 2

    per_layer = 2 * awq(4096, 4096) + 2 * awq(4096, 1024) + 2 * awq(4096, 14336) + awq(14336, 4096)
    assert per_layer == 112_537_600
    expected = 32 * per_layer + 2 * 32768 * 4096 * 2 + (32 * 2 * 4096 + 4096) * 2
    plan = make_plan(gpu_config(MISTRAL, "A10G", algorithm="int4_awq", kv_cache="int8", dtype="float16"))
    assert plan.weights_bytes_per_gpu == expected == 4_138_606_592


def test_qwen25_7b_fp16_tp2_weights_with_qkv_bias():
    params = 3584 * 1792 * 2 + 2 * 3584 * 256 + 3 * 3584 * 9472  # q, o (14 heads), k, v (2 heads), MLP / 2
    per_layer = params * 2 + (1792 + 2 * 256) * 2 + 2 * 3584 * 2  # + q/k/v biases + two norms
    expected = 28 * per_layer + 152064 * 3584 * 2 + 152064 // 2 * 3584 * 2 + 3584 * 2
    plan = make_plan(gpu_config(QWEN, "L40S", dtype="float16", tp=2))
    assert plan.weights_bytes_per_gpu == expected == 8_160_818_176


def test_mixtral_expert_parallel_weights_per_gpu():
    expert = 3 * 4096 * 14336 * 2  # one whole expert per rank and layer (ep 8, moe_tp 1)
    attention = (4096 * 512 * 2 + 4096 * 128 * 2) * 2  # q/o with 4 heads, k/v with 1 head per rank
    per_layer = expert + attention + 4096 * 8 * 2 + 2 * 4096 * 2  # + router + norms
    expected = 32 * per_layer + 32000 * 4096 * 2 + 32000 // 8 * 4096 * 2 + 4096 * 2
    plan = make_plan(gpu_config(MIXTRAL, "H100-SXM", tp=8, moe_ep=8, moe_tp=1))
    assert plan.weights_bytes_per_gpu == expected == 11_907_375_104


def test_smollm2_weights_on_cpu_fp16_and_int4():
    shape = catalog_shape(SMOL)
    tied = dict(separate_lm_head=False)
    assert rank_weights(shape, Mapping(), "none", 2, 128, **tied)[0].total == 134_515_008 * 2

    def awq(i, o):
        return i * o // 2 + (i // 64) * o * 2 + i * 2

    per_layer = 2 * awq(576, 576) + 2 * awq(576, 192) + 2 * awq(576, 1536) + awq(1536, 576)
    expected = 30 * per_layer + 49152 * 576 * 4 + (30 * 2 * 576 + 576) * 4  # one shared fp32 table
    assert rank_weights(shape, Mapping(), "int4_awq", 4, 64, **tied)[0].total == expected == 170_088_192


@pytest.mark.parametrize(
    "model, gpu, tp, extra",
    [
        (LLAMA8, "H100-SXM", 1, {}),
        (LLAMA70, "H200", 4, {}),
        (MISTRAL, "L40S", 1, {}),
        (QWEN, "L40S", 2, {}),
        # FP8 with expert parallelism: the LLM API's (quantize.py cannot split experts, builders/tensorrt_llm/rules.py)
        (MIXTRAL, "H100-SXM", 8, {"moe_ep": 8, "moe_tp": 1, "target": "llmapi"}),
    ],
)
def test_fp8_saves_one_byte_per_quantized_projection_weight(model, gpu, tp, extra):
    s = catalog_shape(model)
    h, q, kv = s.hidden_size, s.num_attention_heads * s.head_dim // tp, max(1, s.num_key_value_heads // tp) * s.head_dim
    attention = h * q + 2 * h * kv + q * h
    if s.is_moe:
        mlp = s.num_local_experts // extra["moe_ep"] * 3 * h * s.intermediate_size // extra["moe_tp"]
    else:
        mlp = 3 * h * s.intermediate_size // tp
    quantized = s.num_hidden_layers * (attention + mlp)
    fp16 = make_plan(gpu_config(model, gpu, tp=tp, dtype="float16", **extra)).weights_bytes_per_gpu
    fp8 = make_plan(gpu_config(model, gpu, tp=tp, algorithm="fp8", dtype="float16", **extra)).weights_bytes_per_gpu
    assert fp16 - fp8 == quantized


def test_smollm2_fp8_weights_formula():
    shape = catalog_shape(SMOL)
    linear = 30 * (576 * 576 * 2 + 576 * 192 * 2 + 3 * 576 * 1536)
    expected = linear + 49152 * 576 * 2 + (30 * 2 * 576 + 576) * 2  # fp8 projections, fp16 table and norms
    assert rank_weights(shape, Mapping(), "fp8", 2, 128, separate_lm_head=False)[0].total == expected


# --- KV budget, blocks, concurrency -----------------------------------------------------------------------------


def test_kv_budget_by_hand_llama8_fp8_h100():
    plan = make_plan(
        gpu_config(LLAMA8, "H100-SXM", algorithm="fp8", kv_cache="fp8", max_batch_size=64, max_input_len=4096, max_seq_len=8192)
    )
    activations = 8192 * (2 * 4096 + (32 + 2 * 8) * 128 + 3 * 14336) * 2 + 64 * 128256 * 4
    free = 80 * GiB - 9_081_200_640 - activations - GiB  # an "80 GB" H100 has 80 GiB; 1 GiB runtime allowance
    tokens = math.floor(free * 0.9 / 65536)
    blocks = math.ceil(tokens / 32)
    assert plan.kv.blocks == blocks == 32089
    assert plan.kv.max_tokens == 32089 * 32
    assert plan.max_concurrent_sequences == 32089 // (8192 // 32) == 125
    assert plan.fits


def test_issue_max_tokens_in_paged_kv_cache_29184_cannot_hold_one_sequence():
    # TensorRT-LLM logged: maxTokensInPagedKvCache (29184) must be larger than beam_width (1) * tokensPerBlock (128)
    # * maxBlocksPerSeq (272) (tensorrtllm_backend #366/#59). The same inputs here:
    plan = make_plan(gpu_config(LLAMA8, "H100-SXM", tokens_per_block=128, max_seq_len=272 * 128, max_input_len=2048, max_tokens=29184))
    assert plan.kv.max_tokens == 29184
    assert plan.kv.limited_by == "max_tokens_in_paged_kv_cache"
    assert plan.blocks_per_sequence == 272
    assert not plan.fits
    where, problem, valid = refusal(plan)
    assert where == "runtime.max_tokens_in_paged_kv_cache"
    assert "272 KV blocks" in problem and "34816" in valid


def test_issue_1400_llama2_7b_kv_allocation_on_a100_80gb():
    # TensorRT-LLM #1400 (v0.8, tokens_per_block 128): Llama-2-7B SmoothQuant, max_batch_size 1, max_num_tokens 4096,
    # beam 5, A100 80 GB, fraction 0.9 -> "Allocate 69524783104 bytes for k/v cache. Using 132608 tokens".
    shape = catalog_shape("meta-llama/Llama-2-7b-hf")
    per_token = kv_bytes_per_token(shape, Mapping(), 32, 2)
    assert per_token == 2 * 32 * 32 * 128 * 2 == 69_524_783_104 // 132_608  # MHA: 512 KiB per token
    memory = rank_memory(0, 69_524_783_104 / 0.9, 0, 0, 0, per_token, 0.9, 128)
    assert memory.blocks_from_memory * 128 == 132_608
    # the whole plan (weights, activations, 1 GiB runtime allowance) lands within 1% of the logged count
    config = gpu_config(
        "meta-llama/Llama-2-7b-hf",
        "A100-80GB",
        algorithm="int8_sq",
        dtype="float16",
        max_batch_size=1,
        max_input_len=2048,
        max_seq_len=4096,
        max_num_tokens=4096,
        tokens_per_block=128,
    )
    config.engine.max_beam_width = 5
    assert make_plan(config).kv.max_tokens == pytest.approx(132_608, rel=0.01)


def test_issue_2268_blocks_are_rounded_up():
    # TensorRT-LLM #2268 (0.13, tokens_per_block 64): Qwen1.5-7B (MHA, fp16) logged "total: 39.39 GiB,
    # available: 21.89 GiB" and "Number of blocks in KV cache primary pool: 631" with the default fraction 0.9.
    shape = catalog_shape("Qwen/Qwen1.5-7B")
    per_token = kv_bytes_per_token(shape, Mapping(), 32, 2)
    for available in (21.885, 21.89, 21.895):  # the log rounds to two decimals
        memory = rank_memory(0, 39.39 * GiB, (39.39 - available) * GiB, 0, 0, per_token, 0.9, 64)
        assert memory.blocks_from_memory == 631  # 630.3-630.6 blocks of tokens, rounded up


def test_cap_is_rounded_up_to_whole_blocks():
    plan = make_plan(gpu_config(LLAMA8, "H100-SXM", max_tokens=1000, max_seq_len=1000, max_input_len=500))
    assert plan.kv.blocks == 32 and plan.kv.max_tokens == 1024  # ceil(1000 / 32) blocks


def test_pipeline_parallel_uses_the_minimum_over_ranks():
    plan = make_plan(gpu_config(LLAMA8, "H100-SXM", pp=3))
    assert [r.layers for r in plan.weights] == [11, 11, 10]
    assert [r.kv_bytes_per_token for r in plan.memory] == [11 * 8 * 128 * 4, 11 * 8 * 128 * 4, 10 * 8 * 128 * 4]
    assert plan.kv.blocks == min(r.blocks_from_memory for r in plan.memory)
    assert plan.kv.blocks == plan.memory[0].blocks_from_memory  # stage 0 carries the embedding and 11 layers
    assert plan.kv.bytes_per_token == 45056


def test_refuses_70b_bf16_on_one_a100_with_the_smallest_fix():
    plan = make_plan(gpu_config(LLAMA70, "A100-80GB", max_seq_len=8192, max_input_len=4096))
    assert not plan.fits
    _where, problem, valid = refusal(plan)
    assert "need more than the 80 GiB" in problem
    assert "parallel.tp: 2" in valid
    assert "fp8" not in valid  # A100 has no FP8


def test_refuses_128k_context_on_l4_and_names_the_longest_sequence_that_fits():
    plan = make_plan(gpu_config(LLAMA8, "L4", max_seq_len=131072, max_input_len=4096))
    activations = 8192 * (2 * 4096 + 48 * 128 + 3 * 14336) * 2 + 8 * 128256 * 4
    blocks = math.ceil(math.floor((24 * GiB - 16_060_522_496 - activations - GiB) * 0.9 / 131072) / 32)
    assert plan.kv.blocks == blocks == 1651
    where, _, valid = refusal(plan)
    assert where == "engine.max_seq_len" and f"engine.max_seq_len: {1651 * 32}" in valid


# --- roofline ----------------------------------------------------------------------------------------------------


def test_decode_roofline_batch1_llama8_bf16_by_hand():
    plan = make_plan(gpu_config(LLAMA8, "H100-SXM"), Workload(1024, 1024))
    weights_read = 8_030_261_248 * 2 - 128256 * 4096 * 2 + 4096 * 2  # all but the embedding table (one row)
    kv_read = 1536 * 131072  # mean context 1024 + 1024 / 2
    memory_s = (weights_read + kv_read) / 3.35e12
    flops = 2 * 32 * 218_103_808 + 2 * 128256 * 4096 + 4 * 32 * 32 * 128 * 1536
    point = plan.point(1)
    assert point.decode.memory_s == pytest.approx(memory_s, rel=1e-12)
    assert point.decode.compute_s == pytest.approx(flops / 989e12, rel=1e-12)
    assert plan.decode_tokens_per_s(1) == pytest.approx(1 / memory_s, rel=1e-12)
    assert plan.decode_tokens_per_s(1) == pytest.approx(220.2, abs=0.1)


def test_prefill_roofline_llama8_bf16_is_compute_bound():
    plan = make_plan(gpu_config(LLAMA8, "H100-SXM"), Workload(1024, 1024))
    flops = 2 * 1024 * 32 * 218_103_808 + 2 * 128256 * 4096 + 4 * 32 * 32 * 128 * (1024 * 1025 / 2)
    point = plan.point(1)
    assert point.prefill.compute_bound
    assert point.prefill.seconds == pytest.approx(flops / 989e12, rel=1e-12)


def test_compute_bound_batch_without_kv_by_hand():
    plan = make_plan(gpu_config(LLAMA8, "H100-SXM"))
    flops_per_token = 2 * (32 * 218_103_808 + 128256 * 4096)
    weights = 8_030_261_248 * 2 - 128256 * 4096 * 2  # plus one embedding row per token
    # smallest b with b * flops / peak > (weights + b * row) / bandwidth
    b = math.floor(weights / 3.35e12 / (flops_per_token / 989e12 - 4096 * 2 / 3.35e12)) + 1
    assert plan.cost.compute_bound_batch(plan.machine, 0.0) == b


def test_long_context_decode_never_turns_compute_bound():
    # every sequence reads its KV once per step for ~1 FLOP per byte: below the H100's ~300 FLOP/byte ridge
    plan = make_plan(gpu_config(LLAMA8, "H100-SXM", max_seq_len=16384, max_input_len=8192))
    assert plan.compute_bound_batch() is None


def test_moe_decode_reads_only_the_experts_the_batch_touches():
    plan = make_plan(gpu_config(MIXTRAL, "H100-SXM", max_seq_len=4096), Workload(1, 1))
    expert = 3 * 4096 * 14336 * 2
    per_layer = (4096 * 4096 * 2 + 4096 * 1024 * 2) * 2 + 8 * 0.25 * expert + 4096 * 8 * 2 + 2 * 4096 * 2
    expected = 32 * per_layer + 32000 * 4096 * 2 + 4096 * 2 + 4096 * 2 + 1.5 * 131072  # lm_head, norm, 1 row, KV
    assert plan.point(1).decode.memory_s * 3.35e12 == pytest.approx(expected, rel=1e-12)


def test_expert_parallel_step_waits_for_the_rank_holding_a_touched_expert():
    plan = make_plan(gpu_config(MIXTRAL, "H100-SXM", tp=8, moe_ep=8, moe_tp=1, max_seq_len=4096), Workload(1, 1))
    # batch 1 touches 2 of 8 experts per layer: the two ranks holding them read one whole expert each
    expert = 3 * 4096 * 14336 * 2
    attention = (4096 * 512 * 2 + 4096 * 128 * 2) * 2
    per_layer = attention + expert + 4096 * 8 * 2 + 2 * 4096 * 2
    expected = 32 * per_layer + 32000 // 8 * 4096 * 2 + 4096 * 2 + 4096 * 2 + 1.5 * 16384
    assert plan.point(1).decode.memory_s * 3.35e12 == pytest.approx(expected, rel=1e-12)


def test_fp8_uses_the_fp8_tensor_peak_and_tp_adds_all_reduce_time():
    fp8 = make_plan(gpu_config(LLAMA70, "H200", algorithm="fp8", tp=4))
    assert fp8.machine.peak_flops == 1979e12 and fp8.machine.compute_precision == "fp8"
    nvlink = link_table()["nvlink"]
    # two ring all-reduces per layer: a call's latency, 2(tp-1) hops, and 2(tp-1)/tp of the activations over NVLink
    latency = 2 * 80 * (nvlink.call_latency_us + 2 * 3 * nvlink.hop_latency_us) * 1e-6
    step = fp8.point(1).decode
    assert step.comm_latency_s == pytest.approx(latency, rel=1e-12)
    assert step.comm_s == pytest.approx(latency + 2 * 80 * 2 * 3 / 4 * 8192 * 2 / 450e9, rel=1e-12)


def test_more_tp_adds_all_reduce_latency_and_pcie_hops_cost_more_than_nvlink():
    latency = {
        (gpu, tp): make_plan(gpu_config(LLAMA70, gpu, algorithm="fp8", tp=tp)).point(1).decode.comm_latency_s
        for gpu in ("H100-SXM", "L40S")
        for tp in (1, 2, 4, 8)
    }
    for gpu in ("H100-SXM", "L40S"):
        assert latency[gpu, 1] == 0.0
        assert latency[gpu, 1] < latency[gpu, 2] < latency[gpu, 4] < latency[gpu, 8]
    assert all(latency["L40S", tp] > latency["H100-SXM", tp] for tp in (2, 4, 8))


def test_pipeline_stage_hand_off_costs_a_call_and_a_hop_per_boundary():
    plan = make_plan(gpu_config(LLAMA70, "H100-SXM", algorithm="fp8", pp=4))
    nvlink = link_table()["nvlink"]
    step = plan.point(1).decode
    assert step.comm_latency_s == pytest.approx(3 * (nvlink.call_latency_us + nvlink.hop_latency_us) * 1e-6, rel=1e-12)
    assert step.comm_s == pytest.approx(step.comm_latency_s + 3 * 8192 * 2 / 450e9, rel=1e-12)


def test_smollm2_on_a_measured_cpu():
    cpu = Device("cpu", 25.0, 50.0, None, None, None, None, None, None, "test", fp32_tflops=0.2, measured_at="now")
    config = parse_config(
        {
            "name": "smol",
            "model": {"source": "smollm2-135m", "name": SMOL, "dtype": "float32"},
            "engine": {"backend": "openvino", "max_batch_size": 16, "max_input_len": 1024, "max_seq_len": 2048, "max_num_tokens": 2048},
            "runtime": {"max_tokens_in_paged_kv_cache": 32768},
            "hardware": {"gpu": "cpu"},
        }
    )
    plan = make_plan(config, device=cpu)
    assert plan.kv.bytes_per_token == 46080 and plan.kv.max_tokens == 32768
    assert plan.max_concurrent_sequences == 16
    weights = 134_515_008 * 4  # the tied table is read whole as lm_head
    memory_s = (weights + 1536 * 46080) / 50e9
    assert plan.decode_tokens_per_s(1) == pytest.approx(1 / memory_s, rel=1e-12)
    assert plan.machine.compute_precision == "fp32"
    assert plan.percent_of_roofline(0.5 / memory_s, 1) == pytest.approx(50.0)


def test_unmeasured_cpu_has_no_roofline_but_still_a_memory_plan():
    cpu = Device("cpu", 24, None, None, None, None, None, None, None, "placeholder")
    config = parse_config(
        {"model": {"source": "smollm2-135m", "name": SMOL}, "engine": {"backend": "openvino"}, "hardware": {"gpu": "cpu"}}
    )
    plan = make_plan(config, device=cpu)
    assert plan.machine is None and plan.decode_tokens_per_s(1) is None
    assert plan.fits and any("--measure-host" in n for n in plan.notes)


# --- recommendations and quantization choices ------------------------------------------------------------------


def test_quantization_support_follows_the_gpu():
    assert quantization_supported(gpu_config(LLAMA8, "H100-SXM"), "fp8")
    assert not quantization_supported(gpu_config(MISTRAL, "A10G", dtype="float16"), "fp8")
    assert not quantization_supported(gpu_config(LLAMA8, "B200"), "int4_awq")


def test_recommendations_respect_kv_capacity_and_speculative_limits():
    plan = make_plan(gpu_config(LLAMA8, "L4", max_batch_size=256, max_input_len=4096, max_seq_len=8192))
    rec = recommend(plan)
    assert rec.max_batch_size <= plan.max_concurrent_sequences
    assert rec.max_num_tokens >= 4096 + rec.max_batch_size and rec.max_num_tokens % 1024 == 0
    assert rec.tokens_per_block in (32, 64)


def test_engine_build_adds_draft_tokens_to_each_sequence():
    def eagle(target):
        config = gpu_config(LLAMA8, "H100-SXM", max_batch_size=8, max_seq_len=8192, max_input_len=4096)
        config.engine.target = target
        config.engine.speculative.mode = "eagle"
        config.engine.speculative.max_draft_len = 63
        config.engine.speculative.draft_model = "/nonexistent/eagle"
        return make_plan(config)

    assert eagle("engine").max_seq_len == 8192 + 63
    assert eagle("engine").blocks_per_sequence == math.ceil((8192 + 63) / 32)
    assert eagle("llmapi").max_seq_len == 8192  # no trtllm-build, no silent adjustment


def test_a_tp_group_across_two_nodes_pays_network_hops_and_bandwidth():
    # NCCL's ring over 16 ranks on 2 nodes: 2 of its 30 steps cross the network
    plan = make_plan(gpu_config(LLAMA70, "H100-SXM", algorithm="fp8", tp=16, nodes=2, gpus_per_node=8))
    nvlink, net = link_table()["nvlink"], link_table()["network"]
    all_reduces = 2 * 80
    latency = all_reduces * (nvlink.call_latency_us + 28 * nvlink.hop_latency_us + 2 * net.hop_latency_us) * 1e-6
    step = plan.point(1).decode
    assert step.comm_latency_s == pytest.approx(latency, rel=1e-12)
    assert step.comm_s == pytest.approx(latency + all_reduces * 2 * 15 / 16 * 8192 * 2 / (net.bandwidth_gb_s * 1e9), rel=1e-12)


def test_pipeline_stages_on_two_nodes_cross_the_network_once():
    plan = make_plan(gpu_config(LLAMA70, "H100-SXM", algorithm="fp8", tp=4, pp=4, nodes=2, gpus_per_node=8))
    nvlink, net = link_table()["nvlink"], link_table()["network"]
    tp_latency = 2 * 80 * (nvlink.call_latency_us + 2 * 3 * nvlink.hop_latency_us)
    # stages 0-1 on node 0, 2-3 on node 1: hand-offs 0->1 and 2->3 inside a node, 1->2 across
    pp_latency = 3 * nvlink.call_latency_us + 2 * nvlink.hop_latency_us + net.hop_latency_us
    assert plan.point(1).decode.comm_latency_s == pytest.approx((tp_latency + pp_latency) * 1e-6, rel=1e-12)
