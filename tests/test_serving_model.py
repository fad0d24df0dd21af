"""The serving model (plan/serving_model.py): properties a configuration tuner relies on, and small cases computed by
hand from the roofline's own step cost."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from test_plan_formulas import LLAMA8, LLAMA70, SMOL, gpu_config

from trtllm_forge.config.load import parse_config
from trtllm_forge.hardware import Device
from trtllm_forge.plan.planner import Plan, Workload, make_plan
from trtllm_forge.plan.serving_model import concurrency_sweep, engine_batch_limit, predict_serving

CPU = Device("cpu", 24.0, 25.0, None, None, None, None, None, None, "test", fp32_tflops=0.25, measured_at="now")


def llama8(workload: Workload, **settings: object) -> Plan:
    options = {"max_batch_size": 64, "max_input_len": 4096, "max_seq_len": 5120, **settings}
    return make_plan(gpu_config(LLAMA8, "H100-SXM", **options), workload)


def smol_cpu(max_batch_size: int = 16, instances: int = 1) -> Plan:
    config = parse_config(
        {
            "name": "smol",
            "model": {"source": "smollm2-135m", "name": SMOL, "dtype": "float32"},
            "engine": {"backend": "openvino", "max_batch_size": max_batch_size, "max_input_len": 1024, "max_seq_len": 2048},
            "runtime": {"max_tokens_in_paged_kv_cache": 32768},
            "triton": {"instances": {"tensorrt_llm": instances}},
            "hardware": {"gpu": "cpu"},
        }
    )
    return make_plan(config, Workload(64, 32), device=CPU)


def test_batch_one_by_hand_from_the_step_cost():
    # ISL within max_num_tokens: one step prefills the prompt (with the decode tokens of the lifetime's average),
    # then OSL - 1 decode steps; the lifetime is OSL steps.
    plan = llama8(Workload(1000, 100))
    machine, cost, ctx = plan.machine, plan.cost, plan.workload.mean_context
    d = 99 / 100  # decode tokens per step: 99 of the 100 steps decode one token
    mixed = cost.step(machine, d + 1000, d + 1, d * ctx + 1000 * 1001 / 2, d * ctx + 1000)
    decode = cost.step(machine, d, d, d * ctx, d * ctx)
    lifetime = mixed.seconds + 99 * decode.seconds
    p = predict_serving(plan, concurrency=1)
    assert (p.batch, p.limited_by) == (1, "concurrency")
    assert p.requests_per_s == pytest.approx(1 / lifetime, rel=1e-12)
    assert p.output_tokens_per_s == pytest.approx(100 / lifetime, rel=1e-12)
    assert p.tpot_ms == pytest.approx(lifetime / 100 * 1e3, rel=1e-12)
    assert p.ttft_ms == pytest.approx((lifetime / 100 / 2 + mixed.seconds) * 1e3, rel=1e-12)


def test_token_budget_stretches_the_lifetime_and_chunks_the_prompt_by_hand():
    # 8 sequences of 4096 + 64 tokens through 2048 tokens a step: 8 x 4159 / 2048 = 16.2 steps of work per lifetime
    # are fewer than 2 chunks + 63 decode steps, so the budget does not bind; each prompt takes two chunks.
    plan = llama8(Workload(4096, 64), max_batch_size=8, max_num_tokens=2048, fraction=0.9)
    machine, cost, ctx = plan.machine, plan.cost, plan.workload.mean_context
    lifetime_steps = 2 + 63
    d = 8 * 63 / lifetime_steps
    chunks = math.ceil(4096 / (2048 - d))
    assert chunks == 3  # the decode tokens leave less than 2048 for the prompt
    prefill_steps = 8 * chunks
    arrivals = 8 / prefill_steps
    prompt = 8 * 4096 / prefill_steps
    mixed = cost.step(
        machine,
        d + prompt,
        d + arrivals,
        d * ctx + arrivals * 4096 * 4097 / 2,
        d * ctx + prompt + arrivals * 4096 * (chunks - 1) / 2,
    )
    decode = cost.step(machine, d, d, d * ctx, d * ctx)
    lifetime = prefill_steps * mixed.seconds + (lifetime_steps - prefill_steps) * decode.seconds
    p = predict_serving(plan, concurrency=8)
    assert p.output_tokens_per_s == pytest.approx(8 * 64 / lifetime, rel=1e-12)
    assert p.ttft_ms == pytest.approx((lifetime / lifetime_steps / 2 + chunks * mixed.seconds) * 1e3, rel=1e-12)


def test_ttft_grows_with_the_prompt():
    ttft = [predict_serving(llama8(Workload(isl, 256)), concurrency=8).ttft_ms for isl in (128, 512, 2048, 4096)]
    assert ttft == sorted(ttft) and len(set(ttft)) == 4


def test_queueing_beyond_max_batch_size_adds_ttft_and_no_tokens_per_s():
    plan = llama8(Workload(1024, 256), max_batch_size=16)
    points = {c: predict_serving(plan, concurrency=c) for c in (8, 16, 32, 64, 128)}
    assert [points[c].limited_by for c in (8, 16, 32)] == ["concurrency", "concurrency", "max_batch_size"]
    full = points[16]
    for c in (32, 64, 128):
        p = points[c]
        assert p.batch == 16 and p.output_tokens_per_s == full.output_tokens_per_s and p.tpot_ms == full.tpot_ms
        # Little's law in a closed loop: the clients beyond the batch wait (c - 16) / throughput
        assert p.ttft_ms - full.ttft_ms == pytest.approx((c - 16) / full.requests_per_s * 1e3, rel=1e-9)
    assert points[8].output_tokens_per_s < full.output_tokens_per_s


def test_batch_never_exceeds_the_limits_the_config_sets():
    plans = [
        llama8(Workload(1024, 256), max_batch_size=256),
        llama8(Workload(4096, 1024), max_batch_size=256, max_tokens=64 * 5120),  # the KV cache binds
        llama8(Workload(128, 128), max_batch_size=4),
        llama8(Workload(64, 64), max_batch_size=256, max_num_tokens=128, max_input_len=64, max_seq_len=128),
        smol_cpu(),
    ]
    seen = set()
    for plan in plans:
        limit, _ = engine_batch_limit(plan)
        for c in (1, 3, 16, 100, 1000):
            p = predict_serving(plan, concurrency=c)
            assert p.batch <= plan.config.engine.max_batch_size
            assert p.batch <= plan.max_concurrent_sequences
            assert p.batch <= plan.config.engine.resolved_max_num_tokens
            assert p.batch == min(c, limit)
            seen.add(p.limited_by)
    assert seen == {"concurrency", "max_batch_size", "kv_cache", "max_num_tokens"}
    kv_bound = predict_serving(plans[1], concurrency=1000)
    assert kv_bound.limited_by == "kv_cache" and kv_bound.batch == plans[1].max_concurrent_sequences < 256


def test_tokens_per_s_saturates_past_the_batch_limit():
    plan = llama8(Workload(512, 512), max_batch_size=32)
    tokens = [predict_serving(plan, concurrency=c).output_tokens_per_s for c in concurrency_sweep(plan)]
    assert concurrency_sweep(plan) == [1, 2, 4, 8, 16, 32, 64]
    assert tokens[:6] == sorted(tokens[:6]) and len(set(tokens[:6])) == 6
    assert tokens[6] == tokens[5]


def test_a_4k_prompt_ttft_is_its_prefill_and_prefills_slow_the_decode():
    plan = llama8(Workload(4096, 1024))
    alone = predict_serving(plan, concurrency=1)
    assert plan.point(1).prefill.seconds * 1e3 / alone.ttft_ms > 0.9
    full = predict_serving(plan, concurrency=64)
    decode_only = plan.point(64).decode.seconds * 1e3
    # the arriving prompts' compute-bound chunks share the steps: 64 prompts per 1024-step lifetime
    amortized_prefill = 64 * plan.point(1).prefill.seconds * 1e3 / 1024
    assert full.tpot_ms - decode_only > 0.5 * amortized_prefill
    short = predict_serving(llama8(Workload(128, 1024)), concurrency=64)
    assert short.tpot_ms < 1.1 * llama8(Workload(128, 1024)).point(64).decode.seconds * 1e3


def test_all_reduce_latency_is_paid_on_every_step():
    plan = make_plan(gpu_config(LLAMA70, "H100-SXM", algorithm="fp8", tp=4, max_batch_size=16), Workload(1024, 256))
    assert plan.machine is not None
    no_latency = replace(plan, machine=replace(plan.machine, link_call_latency_s=0.0, link_hop_latency_s=0.0))
    per_step = plan.point(1).decode.comm_latency_s
    assert per_step > 0
    for c in (1, 16):
        with_latency, without = predict_serving(plan, concurrency=c), predict_serving(no_latency, concurrency=c)
        assert with_latency.tpot_ms - without.tpot_ms == pytest.approx(per_step * 1e3, rel=1e-9)
        assert with_latency.output_tokens_per_s < without.output_tokens_per_s


def test_gpu_workers_each_serve_their_share_and_cpu_instances_share_the_host():
    gpu = llama8(Workload(1024, 256))
    assert predict_serving(gpu, concurrency=32, instances=2) == replace(predict_serving(gpu, concurrency=16), concurrency=32)
    cpu = smol_cpu()
    one, two = predict_serving(cpu, concurrency=16), predict_serving(cpu, concurrency=16, instances=2)
    assert two.batch == 8
    # half the bandwidth each, and each instance reads its own weights every step: no more tokens/s in all
    assert 2 * two.output_tokens_per_s < one.output_tokens_per_s
    half_host = replace(cpu, machine=cpu.machine.shared(2))
    assert two == replace(predict_serving(half_host, concurrency=8), concurrency=16)


def test_no_machine_numbers_no_prediction_and_bad_counts_are_refused():
    unmeasured = make_plan(smol_cpu().config, Workload(64, 32), device=replace(CPU, bandwidth_gb_s=None))
    assert predict_serving(unmeasured, concurrency=4) is None
    with pytest.raises(ValueError):
        predict_serving(smol_cpu(), concurrency=0)
    with pytest.raises(ValueError):
        predict_serving(smol_cpu(), concurrency=1, instances=0)


def test_waves_by_hand_prefill_together_then_decode_alone():
    # 8 prompts of 1000 tokens through 2048 tokens a step: 4 prefill steps, then 99 decode steps of all 8
    plan = llama8(Workload(1000, 100), max_batch_size=8, max_num_tokens=2048)
    machine, cost, ctx = plan.machine, plan.cost, plan.workload.mean_context
    prefill = cost.step(machine, 2000, 2, 2 * 1000 * 1001 / 2, 2000)
    decode = cost.step(machine, 8, 8, 8 * ctx, 8 * ctx)
    wave = 4 * prefill.seconds + 99 * decode.seconds
    p = predict_serving(plan, concurrency=8, arrivals="waves")
    assert p.output_tokens_per_s == pytest.approx(8 * 100 / wave, rel=1e-12)
    median_first_token = 2 * prefill.seconds  # the 4th of 8 prompts ends in the 2nd step
    assert p.ttft_ms == pytest.approx(median_first_token * 1e3, rel=1e-12)
    assert p.tpot_ms == pytest.approx((wave - median_first_token) / 99 * 1e3, rel=1e-12)


def test_waves_make_the_batch_wait_for_every_prompt_and_spread_slows_the_decode():
    plan = llama8(Workload(2048, 256), max_batch_size=32)
    spread = [predict_serving(plan, concurrency=c) for c in (1, 8, 32)]
    waves = [predict_serving(plan, concurrency=c, arrivals="waves") for c in (1, 8, 32)]
    assert [w.ttft_ms for w in waves] == sorted(w.ttft_ms for w in waves)
    assert waves[2].ttft_ms > 4 * spread[2].ttft_ms  # 16 prompts ahead of the median one vs its own prompt
    assert waves[2].tpot_ms < spread[2].tpot_ms  # no prompt chunks in the decode steps after the first token
    with pytest.raises(ValueError):
        predict_serving(plan, concurrency=1, arrivals="bursty")
