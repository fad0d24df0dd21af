#!/usr/bin/env python3
"""Where a batch-1 decode step's time goes, node by node: OpenVINO's own per-node profile (PERF_COUNT).

The served engine's IR (its stateful form: SDPA attention, the same projections and kernels; the served
continuous-batching pipeline steps in about the same time, see bench_batch1_roofline.py) is compiled with the
properties the `tensorrt_llm` model uses, a 64-token prompt is prefilled and 32 tokens are decoded greedily;
each decode step's profile is summed by node type. In the same run, interleaved per repeat, the projection-only
model of bench_batch1_roofline.py (the same fp32 projection shapes and bytes, lm_head included, nothing else) is
profiled the same way: its FullyConnected time is what OpenVINO's kernels need to stream these weights when
nothing else runs between them.

Writes results/bench_batch1_roofline/profile.json; `render_profile` makes the README block `batch1-profile`
(scripts/readme_tables.py).

    .venv/bin/python scripts/bench_batch1_profile.py [--repeats 3] [--root forge-work/bench-cpu] [--note "..."]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from trtllm_forge.bench import provenance

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "results" / "bench_batch1_roofline" / "profile.json"
PROMPT_TOKENS = 64
DECODE_STEPS = 32
PROFILE = {"PERF_COUNT": "YES"}


def _node_ms(request: Any) -> Counter:
    """Milliseconds per node type in the request's last inference."""
    by_type: Counter = Counter()
    for node in request.get_profiling_info():
        by_type[node.node_type] += node.real_time.total_seconds() * 1e3
    return by_type


class EngineSteps:
    """The engine IR's stateful model, compiled like the served engine plus PERF_COUNT, decoding one request."""

    def __init__(self, engine_dir: Path, properties: dict[str, str]) -> None:
        import openvino as ov

        compiled = ov.Core().compile_model(str(engine_dir / "openvino_model.xml"), "CPU", {**properties, **PROFILE})
        self.inputs = {i.get_any_name() for i in compiled.inputs}
        self.request = compiled.create_infer_request()

    def _feed(self, ids: list[int], past: int) -> dict[str, Any]:
        import numpy as np

        n = len(ids)
        feed = {
            "input_ids": np.asarray([ids], np.int64),
            "attention_mask": np.ones((1, past + n), np.int64),
            "position_ids": np.arange(past, past + n, dtype=np.int64)[None],
            "beam_idx": np.zeros(1, np.int32),
        }
        return {k: v for k, v in feed.items() if k in self.inputs}

    def steps(self, prompt: list[int]) -> list[tuple[float, Counter]]:
        """(wall ms, ms per node type) of each decode step after prefilling `prompt`."""
        import numpy as np

        self.request.reset_state()
        self.request.infer(self._feed(prompt, 0))
        past = len(prompt)
        token = int(np.argmax(self.request.get_output_tensor(0).data[0, -1]))
        steps = []
        for _ in range(DECODE_STEPS):
            started = time.perf_counter()
            self.request.infer(self._feed([token], past))
            wall = (time.perf_counter() - started) * 1e3
            past += 1
            token = int(np.argmax(self.request.get_output_tensor(0).data[0, -1]))
            steps.append((wall, _node_ms(self.request)))
        return steps


def floor_steps(floor: Any) -> list[tuple[float, Counter]]:
    steps = []
    for _ in range(DECODE_STEPS):
        started = time.perf_counter()
        floor.request.infer(floor.feed)
        steps.append(((time.perf_counter() - started) * 1e3, _node_ms(floor.request)))
    return steps


def _point(kind: str, repeat: int, steps: list[tuple[float, Counter]], weight_bytes: int, bandwidth: float) -> dict[str, Any]:
    types = sorted({t for _, by_type in steps for t in by_type})
    node_ms = {t: statistics.median(by_type.get(t, 0.0) for _, by_type in steps) for t in types}
    fc_ms = node_ms.get("FullyConnected", 0.0) + node_ms.get("MatMul", 0.0)
    return {
        "kind": kind,
        "repeat": repeat,
        "bandwidth_gb_s": bandwidth / 1e9,
        "step_ms_p50": statistics.median(wall for wall, _ in steps),
        "node_ms_p50": node_ms,
        "projection_ms": fc_ms,
        "projection_bytes": weight_bytes,
        "projection_gb_s": weight_bytes / (fc_ms / 1e3) / 1e9 if fc_ms else 0.0,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import bench_batch1_roofline as roofline  # its projection-only model and prompt
    import bench_cpu_engine as cpu  # the served engine's settings
    from transformers import AutoTokenizer
    from trtllm_forge.builders.openvino.builder import build_engine

    from trtllm_forge.plan.host import measure_bandwidth

    document, base, root, checkpoint = roofline.start_run(args, "trtllm-forge.bench-batch1-profile/1")
    config = cpu.precision_config(base, "fp32")
    engine_dir = build_engine(config, root / "fp32", checkpoint).engine_dir
    assert engine_dir is not None  # an engine-target build
    _, properties = cpu.scheduler_for(config, engine_dir)
    hf_config = json.loads((engine_dir / "hf_config.json").read_text())
    engine = EngineSteps(engine_dir, properties)
    floor = roofline.ProjectionFloor(hf_config, {**properties, **PROFILE})
    prompt = roofline.prompt_of(AutoTokenizer.from_pretrained(str(checkpoint)), PROMPT_TOKENS)
    engine.steps(prompt[:16])  # warm-up: kernels compile on first use
    floor_steps(floor)
    points = []
    for repeat in range(args.repeats):
        kinds = ("engine", "floor") if repeat % 2 == 0 else ("floor", "engine")
        for kind in kinds:
            bandwidth = measure_bandwidth(len(os.sched_getaffinity(0)), 0.5)
            steps = engine.steps(prompt) if kind == "engine" else floor_steps(floor)
            points.append(_point(kind, repeat, steps, floor.weight_bytes, bandwidth))
            print(json.dumps(points[-1]), file=sys.stderr, flush=True)
    document["properties"] = {**properties, **PROFILE}
    document["prompt_tokens"] = PROMPT_TOKENS
    document["decode_steps"] = DECODE_STEPS
    document["points"] = points
    if args.note:
        document["note"] = args.note
    return provenance.finish(document)


def render_profile(document: dict[str, Any]) -> str:
    """The README table and paragraph, every number from `document`."""

    def median_of(kind: str, key: str) -> float:
        return float(statistics.median(p[key] for p in document["points"] if p["kind"] == kind))

    engine_points = [p for p in document["points"] if p["kind"] == "engine"]
    types = {t for p in engine_points for t in p["node_ms_p50"]}
    node_ms = {t: statistics.median(p["node_ms_p50"].get(t, 0.0) for p in engine_points) for t in types}
    total = sum(node_ms.values())
    lines = [
        provenance.measured_where(document)
        + f". Batch 1, fp32, {document['prompt_tokens']}-token prompt, {document['decode_steps']} decode steps per run, "
        f"{len(engine_points)} runs; OpenVINO's per-node profile (PERF_COUNT) of each step, medians.",
        "",
        "| node type | ms per decode step | share of the profiled time |",
        "|---|---:|---:|",
    ]
    shown = sorted(node_ms.items(), key=lambda item: -item[1])
    for node_type, ms in shown[:8]:
        lines.append(f"| {node_type} | {ms:.2f} | {ms / total:.0%} |")
    rest = sum(ms for _, ms in shown[8:])
    lines.append(f"| {len(shown) - 8} other node types | {rest:.2f} | {rest / total:.0%} |")
    lines.append(f"| all nodes | {total:.2f} | 100% |")
    engine_fc, floor_fc = median_of("engine", "projection_ms"), median_of("floor", "projection_ms")
    lines += [
        "",
        f"A decode step takes {median_of('engine', 'step_ms_p50'):.1f} ms (wall); its nodes' profiled times add up to "
        f"{total:.1f} ms. The projections (FullyConnected and MatMul nodes) take {engine_fc:.1f} ms ({engine_fc / total:.0%}) and "
        f"stream their {engine_points[0]['projection_bytes'] / 1e6:.0f} MB of fp32 weights at "
        f"{median_of('engine', 'projection_gb_s'):.1f} GB/s; the same projections alone (the weight-reading floor model) take "
        f"{floor_fc:.1f} ms at {median_of('floor', 'projection_gb_s'):.1f} GB/s, against "
        f"{median_of('engine', 'bandwidth_gb_s'):.1f} GB/s copy bandwidth measured before the runs. Everything else in the "
        f"step (attention, RoPE, norms, residual adds, state reads and writes) takes {total - engine_fc:.1f} ms "
        f"({(total - engine_fc) / total:.0%}).",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_batch1_roofline import batch1_arguments

    args = batch1_arguments(__doc__.splitlines()[0], RESULTS).parse_args(argv)
    document = run(args)
    provenance.write_result(args.out, document)
    print(render_profile(document))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
