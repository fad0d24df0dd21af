"""A plan as one JSON document and as a readable report."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from rich.table import Table

from trtllm_forge.builders.tensorrt_llm.images import LEGACY_ENGINE_PATH
from trtllm_forge.plan.advise import quantization_comparison, recommend
from trtllm_forge.plan.planner import Plan
from trtllm_forge.plan.serving_model import concurrency_sweep, config_instances, engine_batch_limit, predict_serving
from trtllm_forge.plan.workers import describe_workers, dynamo_workers
from trtllm_forge.ui import console

GiB = 1024**3


def legacy_note(plan: Plan) -> str | None:
    """The one sentence on the engine path (TensorRT-LLM 1.2.x, NVIDIA's last engine line); None on other paths."""
    engine = plan.config.engine
    return LEGACY_ENGINE_PATH if engine.backend == "tensorrt-llm" and engine.target == "engine" else None


def plan_to_dict(plan: Plan) -> dict:
    limiting = min(plan.memory, key=lambda r: r.blocks_from_memory)
    dev, w = plan.device, plan.workload
    data: dict[str, Any] = {
        "config": plan.config.name,
        "fits": plan.fits,
        "model": {
            "name": plan.config.model.name or plan.config.model.source,
            "shape_from": plan.shape.origin,
            "parameters": plan.parameters,
            "layers": plan.shape.num_hidden_layers,
            "hidden_size": plan.shape.hidden_size,
            "attention_heads": plan.shape.num_attention_heads,
            "kv_heads": plan.shape.num_key_value_heads,
            "head_dim": plan.shape.head_dim,
            "intermediate_size": plan.shape.intermediate_size,
            "vocab_size": plan.shape.vocab_size,
            "tie_word_embeddings": plan.shape.tie_word_embeddings,
            "experts": plan.shape.num_local_experts,
            "experts_per_token": plan.shape.num_experts_per_tok,
        },
        "hardware": {k: v for k, v in asdict(dev).items()},
        "parallel": asdict(plan.mapping),
        "quantization": {"algorithm": plan.algorithm, "dtype": plan.dtype, "kv_dtype_bytes": plan.kv_dtype_bytes},
        "memory": {
            "device_bytes": round(limiting.device_bytes),
            "weights_bytes_per_gpu": round(plan.weights_bytes_per_gpu),
            "activation_bytes_per_gpu": round(limiting.activations),
            "runtime_overhead_bytes": round(limiting.overhead),
            "free_bytes_per_gpu": round(limiting.free),
            "kv_cache_bytes_per_gpu": plan.kv.max_tokens * limiting.kv_bytes_per_token,
            "per_stage": [
                {
                    "stage": r.stage,
                    "layers": wt.layers,
                    "weights_bytes": round(r.weights),
                    "embedding_bytes": round(wt.embedding),
                    "lm_head_bytes": round(wt.lm_head),
                    "free_bytes": round(r.free),
                    "kv_bytes_per_token": r.kv_bytes_per_token,
                    "kv_blocks_from_memory": r.blocks_from_memory,
                }
                for r, wt in zip(plan.memory, plan.weights, strict=False)
            ],
        },
        "kv_cache": {
            "bytes_per_token": plan.kv.bytes_per_token,
            "tokens_per_block": plan.kv.tokens_per_block,
            "blocks": plan.kv.blocks,
            "max_tokens": plan.kv.max_tokens,
            "limited_by": plan.kv.limited_by,
            "max_seq_len": plan.max_seq_len,
            "blocks_per_sequence": plan.blocks_per_sequence,
            "workload": {"input_len": w.input_len, "output_len": w.output_len},
            # capacity: what the KV cache holds, not a batch size to configure
            "max_concurrent_sequences": plan.max_concurrent_sequences,
            "max_concurrent_full_sequences": plan.max_concurrent_full_sequences,
        },
        "limits": limits_dict(plan),
        "roofline": roofline_dict(plan),
        "serving": serving_dict(plan),
        "notes": plan.notes,
        "engine_path": legacy_note(plan),
    }
    if plan.draft is not None:
        data["memory"]["draft"] = draft_dict(plan)
    if plan.fits:
        rec = recommend(plan)
        data["recommendations"] = asdict(rec)
    data["quantization_comparison"] = quantization_comparison(plan)
    if "dynamo" in plan.config.deploy.model_fields_set:  # the config lays out Dynamo workers (deploy.dynamo)
        data["dynamo"] = dynamo_workers(plan)
    return data


def draft_dict(plan: Plan) -> dict:
    """The draft model's share of the memory per GPU (on the GPU whose target pool is smallest)."""
    draft = plan.draft
    assert draft is not None
    stage = min(plan.memory, key=lambda r: r.blocks_from_memory).stage
    return {
        "shape_from": draft.shape.origin,
        "layers": draft.shape.num_hidden_layers,
        "precision": draft.precision,
        "weights_bytes_per_gpu": round(draft.weights[stage]),
        "activation_bytes_per_gpu": round(draft.activations),
        "kv_bytes_per_token": draft.kv_bytes_per_token[stage],
        "kv_tokens": draft.kv_tokens,
        "kv_cache_bytes_per_gpu": round(draft.kv_bytes(stage)),
        "kv_pool": "its own, sized first" if draft.own_pool else "mirrors the target's blocks",
    }


def roofline_dict(plan: Plan) -> dict:
    m = plan.machine
    if m is None:
        return {
            "available": False,
            "decode_tokens_per_s": {},
            "reason": f"no memory bandwidth or tensor throughput for {plan.device.name}"
            + (": run `trtllm-forge plan --measure-host`" if not plan.device.is_gpu else ""),
        }
    points = [p for b in plan.batches() if (p := plan.point(b)) is not None]
    zero_kv = plan.cost.compute_bound_batch(m, 0.0)
    return {
        "available": True,
        "bandwidth_bytes_per_s": m.bandwidth,
        "peak_flops": m.peak_flops,
        "compute_precision": m.compute_precision,
        "mean_context_tokens": plan.workload.mean_context,
        "decode_tokens_per_s": {str(p.batch): p.tokens_per_s for p in points},
        "tpot_ms": {str(p.batch): p.decode.seconds * 1e3 for p in points},  # decode steps alone
        # every prompt of the batch prefilled in one step: not a TTFT (the serving model's `ttft_ms` is)
        "prefill_ms": {str(p.batch): p.prefill.seconds * 1e3 for p in points},
        "prefill_tokens_per_s": {str(p.batch): p.batch * plan.workload.input_len / p.prefill.seconds for p in points},
        "decode_bound": {str(p.batch): "compute" if p.decode.compute_bound else "memory" for p in points},
        "kv_limited": {str(p.batch): p.kv_limited for p in points},
        "compute_bound_batch": plan.compute_bound_batch(),
        "compute_bound_batch_without_kv": zero_kv,
    }


def limits_dict(plan: Plan) -> dict:
    """The limits the config sets on a step and on the sequences running at once, and which one binds."""
    engine = plan.config.engine
    batch, limited_by = engine_batch_limit(plan)
    return {
        "max_batch_size": engine.max_batch_size,
        "max_num_tokens": engine.resolved_max_num_tokens,
        "kv_cache_tokens": plan.kv.max_tokens,
        "kv_cache_capacity_sequences": plan.max_concurrent_sequences,
        "batch_limit": batch,
        "batch_limited_by": limited_by,
    }


def serving_dict(plan: Plan) -> dict:
    """The serving model's steady state (plan/serving_model.py) at concurrencies 1, 2, 4, ... past the batch limit."""
    instances, instances_from = config_instances(plan)
    base: dict[str, Any] = {"instances": instances, "instances_from": instances_from}
    if plan.machine is None or not plan.fits:
        reason = "the plan does not fit" if plan.machine else f"no memory bandwidth or tensor throughput for {plan.device.name}"
        return {"available": False, "reason": reason, **base, "points": []}
    sweep = concurrency_sweep(plan, instances)

    def points(arrivals: str) -> list[dict]:
        found = [predict_serving(plan, concurrency=c, instances=instances, arrivals=arrivals) for c in sweep]
        return [asdict(p) for p in found if p is not None]

    return {
        "available": True,
        "model": "closed loop, in-flight batching: decode plus prompt chunks within max_num_tokens per step; "
        "best case from the roofline's step cost (measured runs are slower)",
        "workload": {"input_len": plan.workload.input_len, "output_len": plan.workload.output_len},
        **base,
        "instances_share_host": not plan.device.is_gpu,
        "per_instance": ["batch", "output_tokens_per_s", "requests_per_s"],
        "points": points("spread"),  # lengths vary: arrivals spread over the steps
        "points_in_waves": points("waves"),  # fixed lengths, clients starting together: the batch stays in step
    }


def _gb(value: float) -> str:
    return f"{value / GiB:,.2f} GiB"


def show_report(plan: Plan, data: dict) -> None:
    mem, kv, roof = data["memory"], data["kv_cache"], data["roofline"]
    p = plan.mapping
    verdict = "[green]fits[/green]" if plan.fits else "[red]does not fit[/red]"
    console.print(
        f"[bold]{data['model']['name']}[/bold] ({plan.parameters / 1e9:.2f} B parameters) on "
        f"{plan.mapping.tp * plan.mapping.pp} x {plan.device.name} (tp {p.tp}, pp {p.pp}"
        + (f", moe ep {p.moe_ep} x tp {p.moe_tp}" if plan.shape.is_moe else "")
        + f"), {plan.algorithm if plan.algorithm != 'none' else plan.dtype} weights, "
        f"{plan.kv_dtype_bytes}-byte KV: {verdict}"
    )
    table = Table(title="Memory per GPU", show_header=False)
    for label, value in (
        ("device", _gb(mem["device_bytes"])),
        ("weights", _gb(mem["weights_bytes_per_gpu"])),
        ("activations (max_num_tokens)", _gb(mem["activation_bytes_per_gpu"])),
        ("runtime overhead", _gb(mem["runtime_overhead_bytes"])),
        ("free after load", _gb(mem["free_bytes_per_gpu"])),
        ("KV cache", _gb(mem["kv_cache_bytes_per_gpu"])),
    ):
        table.add_row(label, value)
    if "draft" in mem:
        draft = mem["draft"]
        table.add_row(f"draft weights ({draft['precision']})", _gb(draft["weights_bytes_per_gpu"]))
        table.add_row("draft activations", _gb(draft["activation_bytes_per_gpu"]))
        table.add_row(f"draft KV cache ({draft['kv_tokens']:,} tokens)", _gb(draft["kv_cache_bytes_per_gpu"]))
    console.print(table)
    console.print(
        f"KV cache: {kv['bytes_per_token']:,} B/token per GPU, {kv['blocks']:,} blocks x {kv['tokens_per_block']} = "
        f"{kv['max_tokens']:,} tokens (limited by {kv['limited_by']}); one {kv['max_seq_len']}-token sequence needs "
        f"{kv['blocks_per_sequence']} blocks; capacity: {kv['max_concurrent_sequences']} sequences of "
        f"{kv['workload']['input_len']}+{kv['workload']['output_len']} tokens at once "
        f"({kv['max_concurrent_full_sequences']} of max_seq_len)"
    )
    limits = data["limits"]
    console.print(
        f"Limits the config sets: max_batch_size {limits['max_batch_size']}, max_num_tokens {limits['max_num_tokens']:,} per "
        f"step, KV cache {limits['kv_cache_tokens']:,} tokens ({limits['kv_cache_capacity_sequences']} sequences of the "
        f"workload): at most {limits['batch_limit']} sequences run at once (set by {limits['batch_limited_by']})"
    )
    if roof["available"]:
        rt = Table(
            title=f"Roofline of decode steps alone ({roof['compute_precision']} GEMMs, mean context "
            f"{roof['mean_context_tokens']:.0f} tokens)"
        )
        for col in ("batch", "tokens/s", "step ms", "decode bound", "fits KV"):
            rt.add_column(col, justify="right")
        for b in roof["decode_tokens_per_s"]:
            rt.add_row(
                b,
                f"{roof['decode_tokens_per_s'][b]:,.0f}",
                f"{roof['tpot_ms'][b]:.2f}",
                roof["decode_bound"][b],
                "no" if roof["kv_limited"][b] else "yes",
            )
        console.print(rt)
        knee = roof["compute_bound_batch"]
        console.print(
            f"decode turns compute-bound at batch {knee}"
            if knee
            else "decode stays memory-bound at every batch for this context (KV reads grow as fast as FLOPs); "
            f"without KV reads it would turn compute-bound at batch {roof['compute_bound_batch_without_kv']}"
        )
    if data["serving"]["available"]:
        show_serving(data["serving"])
    prediction = data.get("prediction")
    if prediction and prediction["status"] == "simulated":
        show_prediction(prediction, data)
    if "recommendations" in data:
        rec = data["recommendations"]
        rtab = Table(title="Recommended settings")
        for col in ("setting", "value", "why"):
            rtab.add_column(col)
        for key, why in rec["reasons"].items():
            rtab.add_row(key, str(rec[key]), why)
        console.print(rtab)
    qt = Table(title="Quantization choices (same model, GPU and parallelism)")
    for col in ("algorithm", "supported", "weights/GPU", "KV tokens", "KV capacity (sequences)", "tokens/s"):
        qt.add_column(col, justify="right")
    for row in data["quantization_comparison"]:
        tps = row["decode_tokens_per_s"]
        qt.add_row(
            row["algorithm"],
            "yes" if row["supported"] else "no",
            _gb(row["weights_bytes_per_gpu"]),
            f"{row['kv_max_tokens']:,}",
            str(row["max_concurrent_sequences"]),
            f"{tps:,.0f} @ {row['batch']}" if tps else "-",
        )
    console.print(qt)
    if "dynamo" in data:
        console.print(describe_workers(data["dynamo"]))
    for note in plan.notes:
        console.print(f"note: {note}")
    if data["engine_path"]:
        console.print(f"note: {data['engine_path']}")


def show_serving(serving: dict) -> None:
    """The serving model's table: per concurrency, the batch and its limit, TTFT, TPOT and throughput."""
    instances, w = serving["instances"], serving["workload"]
    table = Table(
        title=f"Serving steady state ({w['input_len']}+{w['output_len']} tokens, closed loop, in-flight batching, "
        f"{instances} instance{'s' if instances > 1 else ''} ({serving['instances_from']}); best case)"
    )
    for col in ("concurrency", "batch", "limited by", "TTFT ms", "TPOT ms", "tokens/s", "requests/s"):
        table.add_column(col, justify="right")
    for p in serving["points"]:
        table.add_row(
            str(p["concurrency"]),
            f"{p['batch']}" + (f" x {instances}" if instances > 1 else ""),
            p["limited_by"],
            f"{p['ttft_ms']:,.1f}",
            f"{p['tpot_ms']:.2f}",
            f"{p['output_tokens_per_s'] * instances:,.0f}",
            f"{p['requests_per_s'] * instances:,.2f}",
        )
    console.print(table)
    if serving["instances_share_host"] and instances > 1:
        console.print("serving: the instances share this host's measured bandwidth and cores")


def roofline_at(data: dict, batch: int) -> dict[str, float] | None:
    """forge's roofline at one batch size in the prediction's terms (None without device numbers or that batch)."""
    roof, mem, kv = data["roofline"], data["memory"], data["kv_cache"]
    key = str(batch)
    if not roof["available"] or key not in roof["tpot_ms"]:
        return None
    gpus = data["parallel"]["tp"] * data["parallel"]["pp"]
    workload = kv["workload"]
    kv_bytes = min(kv["bytes_per_token"] * batch * (workload["input_len"] + workload["output_len"]), mem["kv_cache_bytes_per_gpu"])
    held = mem["weights_bytes_per_gpu"] + mem["activation_bytes_per_gpu"] + mem["runtime_overhead_bytes"] + kv_bytes
    return {
        "ttft_ms": roof["prefill_ms"]["1"],  # one prompt prefilled alone: the least time to a request's first token
        "tpot_ms": roof["tpot_ms"][key],
        "tokens_per_s_per_gpu": roof["decode_tokens_per_s"][key] / gpus,
        "tokens_per_s_per_user": 1e3 / roof["tpot_ms"][key],
        "memory_gib_per_gpu": held / GiB,
    }


def show_prediction(prediction: dict, data: dict) -> None:
    """AIConfigurator's simulated numbers beside forge's roofline at the same batch size and lengths."""
    inputs, values = prediction["inputs"], prediction["values"]
    batch = inputs["batch_size"]
    table = Table(
        title=f"Prediction at batch {batch}, {inputs['isl']}+{inputs['osl']} tokens: AIConfigurator {prediction['version']} "
        f"(simulated; database {prediction['database_source']} {prediction['database_version']}, TensorRT-LLM "
        f"{prediction['backend_version']}, {prediction['system']}) beside forge's roofline"
    )
    for col in ("", "TTFT ms", "TPOT ms", "tokens/s/GPU", "tokens/s/user", "memory/GPU"):
        table.add_column(col, justify="right")

    def row(label: str, v: dict[str, float]) -> None:
        table.add_row(
            label,
            f"{v['ttft_ms']:,.1f}",
            f"{v['tpot_ms']:.2f}",
            f"{v['tokens_per_s_per_gpu']:,.0f}",
            f"{v['tokens_per_s_per_user']:,.1f}",
            f"{v['memory_gib_per_gpu']:,.2f} GiB",
        )

    row("AIConfigurator (simulated)", values)
    roof = roofline_at(data, batch)
    if roof is not None:
        row("forge roofline (limit)", roof)
    console.print(table)
    if roof is not None:
        console.print("prediction: the roofline's TTFT is one prompt prefilled alone; its memory holds the batch's KV cache")
    for note in prediction["notes"]:
        console.print(f"prediction: {note}")
