#!/usr/bin/env python3
"""Batch 1 against the decode roofline `plan` computes, and what bounds it when it falls short.

One request at a time through our engine in-process (OpenVINO GenAI ContinuousBatchingPipeline with the
scheduler the Triton `tensorrt_llm` model builds), greedy, output length forced. Each decode step is timed on
its own; the decode rate is 1000 / median step time (ms), so prefill and start-up are not in it.

The roofline is `plan`'s: for every measured point the plan is made with the memory bandwidth measured right
before that point (plan --measure-host's copy test), so a neighbour's load on this shared machine moves both
sides of the ratio. Variants, interleaved per repeat (order rotated):

- threads: OpenVINO's INFERENCE_NUM_THREADS 1 and the default (all cores), against the copy bandwidth one
  thread and all threads reach;
- weights: fp32 and int8 (weight-only), where the roofline's bytes per step shrink ~4× for the projections;
- KV reads: a 64-token and a 960-token prompt, where the roofline's KV bytes per step grow ~15×;
- pipeline: the stateful LLMPipeline (OpenVINO's SDPA attention, no paged cache, no scheduler) on the same IR,
  timed between streamed tokens: what the continuous-batching pipeline's paging and scheduling cost at batch 1;
- weight-reading floor: an OpenVINO model of nothing but the model's projections (the same shapes and bytes of
  fp32 weights, lm_head included) run once per "step": how fast OpenVINO's own FullyConnected kernels stream
  these weights on this machine. Against the roofline the floor says how much of the copy
  bandwidth a read-only kernel reaches; the same on one thread, and the same products in numpy's BLAS (another
  library's kernels on the same bytes);
- OpenVINO properties: TBB's static partitioner against the default.

The effective bandwidth of a step (the bytes `plan` says it must move ÷ its measured time) against the copy
bandwidth says whether the step is memory-bound or spends its time elsewhere (per-step overhead, compute).

Writes results/bench_batch1_roofline/batch1.json; `render_report` makes the README paragraph and table
(scripts/readme_tables.py, block `batch1-roofline`).

    .venv/bin/python scripts/bench_batch1_roofline.py [--repeats 3] [--root forge-work/bench-cpu] [--note "..."]
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from trtllm_forge.bench import provenance
from trtllm_forge.pipeline import measure_host_once

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "results" / "bench_batch1_roofline" / "batch1.json"
OUTPUT_TOKENS = 32
GOAL = 0.80  # issue 16: batch 1 at >= 80% of the roofline


@dataclasses.dataclass(frozen=True)
class Variant:
    name: str
    precision: str  # fp32 | int8
    threads: int | None  # None: OpenVINO's default (all cores)
    prompt_tokens: int
    # engine: the served ContinuousBatchingPipeline | stateful: LLMPipeline, SDPA | floor: projections only, OpenVINO |
    # blas: projections only, numpy's BLAS
    kind: str = "engine"
    properties: tuple[tuple[str, str], ...] = ()  # OpenVINO properties on top of the served ones

    @property
    def tags(self) -> set[str]:
        """What sets this variant apart from the served default (the names --skip takes)."""
        return {
            t
            for t, on in (
                ("threads", self.threads is not None),
                ("int8", self.precision == "int8"),
                ("long", self.prompt_tokens > 64),
                (self.kind, self.kind != "engine"),
                ("properties", bool(self.properties)),
            )
            if on
        }


VARIANTS = (
    Variant("fp32, all threads, 64-token prompt (the served default)", "fp32", None, 64),
    Variant("fp32, 1 thread, 64-token prompt", "fp32", 1, 64),
    Variant("int8 weights, all threads, 64-token prompt", "int8", None, 64),
    Variant("fp32, all threads, 960-token prompt", "fp32", None, 960),
    Variant("fp32, stateful LLMPipeline (SDPA), 64-token prompt", "fp32", None, 64, "stateful"),
    Variant("fp32 projections only (weight-reading floor)", "fp32", None, 64, "floor"),
    Variant("fp32 projections only, 1 thread", "fp32", 1, 64, "floor"),
    Variant("fp32 projections only, numpy BLAS", "fp32", None, 64, "blas"),
    # TBB's static partitioner: equal shares per thread, no work stealing; the same arithmetic per output (tokens
    # stayed identical), about 15% less CPU time per step in a loaded in-process run
    Variant("fp32, TBB static partitioner", "fp32", None, 64, properties=(("TBB_PARTITIONER", "STATIC"),)),
)


def info(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def prompt_of(tokenizer: Any, tokens: int) -> list[int]:
    """A prompt of exactly `tokens` token ids: the shipped perplexity text, repeated as needed."""
    from trtllm_forge.verify.reference import default_text

    ids: list[int] = tokenizer(default_text()[0])["input_ids"]
    while len(ids) < tokens:
        ids = ids + ids
    return ids[:tokens]


def decode_steps(pipeline: Any, prompt: list[int], output_tokens: int) -> list[float]:
    """Seconds of each decode step of one request (the first step, prefill, left out)."""
    import numpy as np
    import openvino as ov
    import openvino_genai as ov_genai

    config = ov_genai.GenerationConfig()
    config.max_new_tokens = output_tokens
    config.min_new_tokens = output_tokens
    config.do_sample = False
    handle = pipeline.add_request(0, ov.Tensor(np.asarray([prompt], dtype=np.int64)), config)
    steps: list[float] = []
    first = True
    while pipeline.has_non_finished_requests():
        started = time.perf_counter()
        pipeline.step()
        elapsed = time.perf_counter() - started
        if not first:
            steps.append(elapsed)
        first = False
        while handle.can_read():
            handle.read()
    return steps


def stateful_steps(pipeline: Any, prompt: list[int], output_tokens: int) -> list[float]:
    """Seconds between the streamed tokens of one LLMPipeline request (prefill, before the first token, left out)."""
    import numpy as np
    import openvino as ov
    import openvino_genai as ov_genai

    config = ov_genai.GenerationConfig()
    config.max_new_tokens = output_tokens
    config.min_new_tokens = output_tokens
    config.do_sample = False
    stamps: list[float] = []

    class Stamps(ov_genai.StreamerBase):  # token ids as they are made (a plain callback gets text, which may lag)
        def write(self, _token: Any) -> Any:
            stamps.append(time.perf_counter())
            return ov_genai.StreamingStatus.RUNNING

        def end(self) -> None:
            pass

    pipeline.generate(ov.Tensor(np.asarray([prompt], dtype=np.int64)), config, Stamps())
    return [b - a for a, b in itertools.pairwise(stamps)]


def projection_shapes(hf_config: dict[str, Any]) -> list[tuple[int, int]]:
    """(in, out) of every weight matrix a decode step reads, lm_head included (llama-family layout)."""
    hidden, inter = int(hf_config["hidden_size"]), int(hf_config["intermediate_size"])
    heads = int(hf_config["num_attention_heads"])
    head_dim = int(hf_config.get("head_dim") or hidden // heads)
    kv = int(hf_config.get("num_key_value_heads") or heads) * head_dim
    layer = [
        (hidden, heads * head_dim),
        (hidden, kv),
        (hidden, kv),
        (heads * head_dim, hidden),
        (hidden, inter),
        (hidden, inter),
        (inter, hidden),
    ]
    return layer * int(hf_config["num_hidden_layers"]) + [(hidden, int(hf_config["vocab_size"]))]


class ProjectionFloor:
    """An OpenVINO model of only the projections (fp32 weights of the model's shapes), compiled like the engine."""

    def __init__(self, hf_config: dict[str, Any], properties: dict[str, str]) -> None:
        import numpy as np
        import openvino as ov
        import openvino.opset13 as op

        rng = np.random.default_rng(0)
        shapes = projection_shapes(hf_config)
        inputs = {k: op.parameter([1, k], np.float32, name=f"x{k}") for k in dict.fromkeys(k for k, _ in shapes)}
        outputs = [
            op.reduce_sum(op.matmul(inputs[k], op.constant(rng.standard_normal((n, k), dtype=np.float32)), False, True), [1], True)
            for k, n in shapes
        ]
        model = ov.Model([op.concat(outputs, 1)], list(inputs.values()))
        compile_properties = {k: v for k, v in properties.items() if not k.startswith("KV_CACHE")}
        self.request = ov.Core().compile_model(model, "CPU", compile_properties).create_infer_request()
        self.feed = {f"x{k}": np.ones((1, k), np.float32) for k in inputs}
        self.weight_bytes = sum(4 * k * n for k, n in shapes)

    def steps(self, count: int) -> list[float]:
        times = []
        for _ in range(count):
            started = time.perf_counter()
            self.request.infer(self.feed)
            times.append(time.perf_counter() - started)
        return times


class BlasFloor:
    """The same projections as matrix-vector products in numpy's BLAS (its own threads, all cores): another
    library's kernels streaming the same bytes, to tell OpenVINO's kernels from the machine."""

    def __init__(self, hf_config: dict[str, Any]) -> None:
        import numpy as np

        rng = np.random.default_rng(0)
        shapes = projection_shapes(hf_config)
        self.weights = [rng.standard_normal((n, k), dtype=np.float32) for k, n in shapes]
        self.inputs = {k: np.ones(k, np.float32) for k, _ in shapes}
        self.weight_bytes = sum(w.nbytes for w in self.weights)

    def steps(self, count: int) -> list[float]:
        times = []
        for _ in range(count):
            started = time.perf_counter()
            for w in self.weights:
                w @ self.inputs[w.shape[1]]
            times.append(time.perf_counter() - started)
        return times


def steps_of(variant: Variant, pipeline: Any, prompt: list[int], output_tokens: int) -> list[float]:
    if variant.kind in ("floor", "blas"):
        return pipeline.steps(output_tokens - 1)
    if variant.kind == "stateful":
        return stateful_steps(pipeline, prompt, output_tokens)
    return decode_steps(pipeline, prompt, output_tokens)


def start_run(args: argparse.Namespace, schema: str) -> tuple[dict[str, Any], Any, Path, Path]:
    """(result document with provenance, base config, work root, imported checkpoint) for a batch-1 script's run."""
    from trtllm_forge.config import load_config
    from trtllm_forge.importer.stage import import_checkpoint

    document = provenance.record()
    document["schema"] = schema
    base = load_config(args.config)
    root = args.root.resolve()
    return document, base, root, import_checkpoint(base, root / "import").checkpoint_dir.resolve()


def run(args: argparse.Namespace) -> dict[str, Any]:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import bench_cpu_engine as cpu  # the same engines and scheduler as the CPU engine benchmark
    import openvino_genai as ov_genai
    from transformers import AutoTokenizer
    from trtllm_forge.builders.openvino.builder import build_engine

    from trtllm_forge.plan.host import measure_bandwidth
    from trtllm_forge.plan.planner import Workload, make_plan, resolve_inputs

    document, base, root, checkpoint = start_run(args, "trtllm-forge.bench-batch1-roofline/1")
    tokenizer = AutoTokenizer.from_pretrained(str(checkpoint))
    measure_host_once(base)  # a fresh machine has no measured cpu entry: the plan needs its FLOP/s too
    shape, device = resolve_inputs(base)
    threads_all = len(os.sched_getaffinity(0))

    skip = {name.strip() for name in args.skip.split(",") if name.strip()}
    variants = tuple(v for v in VARIANTS if not skip & v.tags)
    pipelines: dict[tuple[str, int | None, str, tuple[tuple[str, str], ...]], Any] = {}
    configs = {}
    for variant in variants:
        if variant.precision not in configs:
            config = cpu.precision_config(base, variant.precision)
            engine_dir = build_engine(config, root / variant.precision, checkpoint).engine_dir
            assert engine_dir is not None  # an engine-target build
            configs[variant.precision] = (config, engine_dir)
        key = (variant.precision, variant.threads, variant.kind, variant.properties)
        if key not in pipelines:
            config, engine_dir = configs[variant.precision]
            scheduler, properties = cpu.scheduler_for(config, engine_dir)
            if variant.threads is not None:
                properties["INFERENCE_NUM_THREADS"] = str(variant.threads)
            properties.update(variant.properties)
            if variant.kind == "floor":
                pipelines[key] = ProjectionFloor(json.loads((engine_dir / "hf_config.json").read_text()), properties)
            elif variant.kind == "blas":
                pipelines[key] = BlasFloor(json.loads((engine_dir / "hf_config.json").read_text()))
            elif variant.kind == "stateful":
                pipelines[key] = ov_genai.LLMPipeline(str(engine_dir), "CPU", ATTENTION_BACKEND="SDPA", **properties)
            else:
                pipelines[key] = ov_genai.ContinuousBatchingPipeline(str(engine_dir), scheduler, "CPU", properties)
                cpu.warm_up_and_commit(pipelines[key], ov_genai, scheduler.max_num_seqs)  # as the engine model does at load
            steps_of(variant, pipelines[key], prompt_of(tokenizer, 16), 4)  # warm-up: kernels compile on first use

    points = []
    for repeat in range(args.repeats):
        order = variants[repeat % len(variants) :] + variants[: repeat % len(variants)]
        for variant in order:
            threads = variant.threads or threads_all
            key = (variant.precision, variant.threads, variant.kind, variant.properties)
            bandwidth = measure_bandwidth(threads, 0.5)
            steps = steps_of(variant, pipelines[key], prompt_of(tokenizer, variant.prompt_tokens), OUTPUT_TOKENS)
            config, _ = configs[variant.precision]
            measured_device = dataclasses.replace(device, bandwidth_gb_s=bandwidth / 1e9)
            plan = make_plan(config, Workload(variant.prompt_tokens, OUTPUT_TOKENS), shape, measured_device)
            point = plan.point(1)
            assert point is not None, "the plan has no machine numbers"
            step_ms = statistics.median(steps) * 1000
            bytes_per_step = pipelines[key].weight_bytes if variant.kind in ("floor", "blas") else point.decode.memory_s * bandwidth
            row = {
                "variant": variant.name,
                "kind": variant.kind,
                "precision": variant.precision,
                "threads": threads,
                "prompt_tokens": variant.prompt_tokens,
                "repeat": repeat,
                "bandwidth_gb_s": bandwidth / 1e9,
                "decode_steps": len(steps),
                "step_ms_p50": step_ms,
                "step_ms_min": min(steps) * 1000,
                "tokens_per_s": 1000 / step_ms,
                "roofline_tokens_per_s": point.tokens_per_s,
                "roofline_memory_bound": not point.decode.compute_bound,
                "roofline_bytes_per_step": bytes_per_step,
                "roofline_compute_ms": point.decode.compute_s * 1000,
                "effective_bandwidth_gb_s": bytes_per_step / (step_ms / 1000) / 1e9,
                "share_of_roofline": (1000 / step_ms) / point.tokens_per_s,
                "load_average": os.getloadavg()[0],
            }
            points.append(row)
            info(json.dumps(row))
    document["output_tokens"] = OUTPUT_TOKENS
    document["model"] = base.model.name
    document["device_table_fp32_tflops"] = device.fp32_tflops
    document["points"] = points
    if args.note:
        document["note"] = args.note
    return provenance.finish(document)


def _summary(document: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for variant in dict.fromkeys(p["variant"] for p in document["points"]):
        points = [p for p in document["points"] if p["variant"] == variant]

        def med(key: str, points: list[dict[str, Any]] = points) -> float:
            return float(statistics.median(p[key] for p in points))

        rows.append(
            {
                "variant": variant,
                "runs": len(points),
                **{
                    k: med(k)
                    for k in (
                        "tokens_per_s",
                        "roofline_tokens_per_s",
                        "share_of_roofline",
                        "bandwidth_gb_s",
                        "effective_bandwidth_gb_s",
                        "step_ms_p50",
                        "step_ms_min",
                        "roofline_bytes_per_step",
                    )
                },
            }
        )
        # the fastest step of a run: the one least delayed by other processes on a shared machine
        rows[-1]["best_step_share"] = float(statistics.median((1000 / p["step_ms_min"]) / p["roofline_tokens_per_s"] for p in points))
    return rows


def render_report(document: dict[str, Any]) -> str:
    """The README table and a paragraph whose every number comes from `document`."""
    rows = _summary(document)
    lines = [
        provenance.measured_where(document)
        + f". Batch 1, {document['output_tokens']} tokens decoded per run, medians over the runs; the roofline is `plan`'s at the copy "
        "bandwidth measured right before each run.",
        "",
        "| variant | runs | decode tok/s | roofline tok/s | share | copy bandwidth (GB/s) | effective bandwidth (GB/s) | step p50 (ms) "
        "| fastest step (ms) | share at the fastest step |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['variant']} | {r['runs']} | {r['tokens_per_s']:.1f} | {r['roofline_tokens_per_s']:.1f} | {r['share_of_roofline']:.0%} | "
            f"{r['bandwidth_gb_s']:.2f} | {r['effective_bandwidth_gb_s']:.2f} | {r['step_ms_p50']:.1f} | {r['step_ms_min']:.1f} | "
            f"{r['best_step_share']:.0%} |"
        )
    by = {r["variant"]: r for r in rows}
    default, one, int8, long, stateful, floor, floor_one, blas, static = (by.get(v.name) for v in VARIANTS)
    lines.append("")
    if default:
        verdict = "meets" if default["share_of_roofline"] >= GOAL else "misses"
        text = (
            f"Batch 1 decodes at {default['tokens_per_s']:.1f} tok/s, {default['share_of_roofline']:.0%} of the roofline "
            f"({default['roofline_tokens_per_s']:.1f} tok/s at {default['bandwidth_gb_s']:.2f} GB/s): it {verdict} the {GOAL:.0%} goal."
        )
        if one:
            text += (
                f" One thread: {one['tokens_per_s']:.1f} tok/s ({one['tokens_per_s'] / default['tokens_per_s']:.2f}× all threads) "
                f"while one thread copies at {one['bandwidth_gb_s']:.2f} GB/s ({one['bandwidth_gb_s'] / default['bandwidth_gb_s']:.2f}×)."
            )
        if int8:
            bytes_ratio = default["roofline_bytes_per_step"] / int8["roofline_bytes_per_step"]
            text += (
                f" int8 weights: {int8['tokens_per_s']:.1f} tok/s ({int8['tokens_per_s'] / default['tokens_per_s']:.2f}× fp32) for "
                f"{bytes_ratio:.2f}× fewer bytes per step."
            )
        if long:
            text += (
                f" A 960-token prompt: {long['tokens_per_s']:.1f} tok/s ({long['tokens_per_s'] / default['tokens_per_s']:.2f}× the "
                f"64-token prompt) for {long['roofline_bytes_per_step'] / default['roofline_bytes_per_step']:.2f}× the bytes (KV reads)."
            )
        if stateful:
            text += (
                f" The stateful LLMPipeline (SDPA attention, no paged cache or scheduler) on the same IR steps in "
                f"{stateful['step_ms_p50']:.1f} ms ({stateful['step_ms_p50'] / default['step_ms_p50']:.2f}× the served pipeline's step)."
            )
        if static:
            text += (
                f" TBB's static partitioner (TBB_PARTITIONER STATIC): {static['tokens_per_s']:.1f} tok/s "
                f"({static['tokens_per_s'] / default['tokens_per_s']:.2f}× the default)."
            )
        if floor:
            rest = default["step_ms_p50"] - floor["step_ms_p50"]
            text += (
                f" Reading the weights alone (an OpenVINO model of only the {floor['roofline_bytes_per_step'] / 1e6:.0f} MB of fp32 "
                f"projections, lm_head included) takes {floor['step_ms_p50']:.1f} ms per step, {floor['share_of_roofline']:.0%} of the "
                f"roofline at an effective {floor['effective_bandwidth_gb_s']:.2f} GB/s (fastest {floor['step_ms_min']:.1f} ms); "
                + (
                    f"the engine's step takes {rest:.1f} ms ({rest / default['step_ms_p50']:.0%}) longer (run apart from the floor: "
                    "bench_batch1_profile.py splits one step by node)."
                    if rest >= 0
                    else "no faster than the engine's whole step in this run, so the split is lost in the noise."
                )
            )
            if floor_one:
                text += (
                    f" On one thread the projections take {floor_one['step_ms_p50']:.1f} ms ({floor_one['effective_bandwidth_gb_s']:.2f} GB/s "
                    f"effective)."
                )
            if blas:
                text += (
                    f" numpy's BLAS reads the same projections in {blas['step_ms_p50']:.1f} ms ({blas['effective_bandwidth_gb_s']:.2f} GB/s "
                    f"effective, {blas['step_ms_p50'] / floor['step_ms_p50']:.2f}× OpenVINO's time)."
                )
        text += (
            f" The fp32 step moves {default['roofline_bytes_per_step'] / 1e6:.0f} MB at an effective "
            f"{default['effective_bandwidth_gb_s']:.2f} GB/s against {default['bandwidth_gb_s']:.2f} GB/s copy bandwidth; its fastest "
            f"step reaches {default['best_step_share']:.0%} of the roofline. Where the median step is much slower than the fastest "
            "one, the time went to waiting for a core (other processes), not to moving bytes."
        )
        lines.append(text)
    return "\n".join(lines) + "\n"


def batch1_arguments(description: str, results: Path) -> argparse.ArgumentParser:
    """The options every batch-1 script takes: config, work root, repeats, note, result file."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--config", type=Path, default=REPO / "configs" / "smollm2-cpu.yaml")
    parser.add_argument("--root", type=Path, default=Path("forge-work") / "bench-cpu", help="engines are built (cached) here")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--note", help="stored with the results, e.g. what else ran on the machine")
    parser.add_argument("--out", type=Path, default=results)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = batch1_arguments(__doc__.splitlines()[0], RESULTS)
    parser.add_argument(
        "--skip", default="", help="comma-separated variants to leave out: threads, int8, long, stateful, floor, blas, properties"
    )
    args = parser.parse_args(argv)
    document = run(args)
    provenance.write_result(args.out, document)
    print(render_report(document))
    info(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
