#!/usr/bin/env python
"""Speculative decoding served on CPU: the fp32 engine alone vs the same engine with an int8 draft of itself
(engine.speculative draft_target), both behind a real Triton, at batch 1 (one request at a time).

Each prompt is sent to the `tensorrt_llm` model of both servers in turn (interleaved, so both see the same
machine load), greedy, token ids in and out, not streamed; in the same rounds the same engine directories run
in this process (OpenVINO GenAI's ContinuousBatchingPipeline with the settings the engine model uses), alone,
with the draft as built, and with the draft on the target's thread count. Reported: output tokens/s of each,
the served and in-process ratios (goal >= 1.3x served), how many prompts' tokens are identical with and without
the draft (goal: all), and from GenAI's per-model metrics why: the draft's step and the target's verify step as
multiples of the target's own decode step, the accepted share of drafted tokens and tokens per speculative step.

    python scripts/bench_cpu_speculative.py [--config configs/smollm2-cpu.yaml] [--root forge-work/bench-spec]
        [--checkpoint DIR] [--draft-len 5] [--prompts 8] [--max-tokens 64] [--note TEXT]
        [--json results/bench_cpu_speculative/batch1.json]

Engines are built (and cached) under --root with the project's own stages; nothing is downloaded.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from trtllm_forge.model_repo_templates.cpu.tensorrt_llm.genai_settings import kv_blocks_for, pipeline_properties, scheduler_config
from trtllm_forge.model_repo_templates.cpu.tensorrt_llm.kv_pool import warm_up_and_commit

from trtllm_forge.bench import provenance

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "results" / "bench_cpu_speculative" / "batch1.json"
GOAL_RATIO = 1.3


def info(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def variant(base, name: str, speculative: dict | None):
    data = base.model_dump(mode="json")
    data["name"] = name
    data["triton"].update({"http_port": 0, "grpc_port": 0, "metrics_port": 0})
    if speculative:
        data["engine"]["speculative"] = speculative
    return type(base).model_validate({**data, "config_dir": str(base.config_dir)})


class InProcess:
    """The engine directory in this process, set up as the CPU engine model sets it up (scheduler from the engine's
    config.json, its precision hints, the draft it names with its properties), run one request at a time."""

    def __init__(self, engine_dir: Path, kv_tokens: int, draft_properties: dict[str, str] | None = None):
        import openvino_genai as ov_genai

        engine = json.loads((engine_dir / "config.json").read_text())
        build, section = engine["build_config"], engine.get("openvino", {})
        scheduler = scheduler_config(
            ov_genai,
            kv_blocks=kv_blocks_for(kv_tokens),
            max_batch_size=int(build["max_batch_size"]),
            max_num_tokens=build.get("max_num_tokens"),
            max_input_len=int(build["max_input_len"]),
            prefix_caching=False,
            split_fuse=False,  # off with a draft, as in the CPU engine model
        )
        properties: dict[str, Any] = dict(pipeline_properties(section.get("properties")))
        draft = section.get("draft") or None
        self.num_assistant_tokens = int(draft["num_assistant_tokens"]) if draft else 0
        if draft:
            extra = draft.get("properties") or {} if draft_properties is None else draft_properties
            self.draft_properties = {**properties, **{str(k): str(v) for k, v in extra.items()}}
            properties["draft_model"] = ov_genai.draft_model(str(engine_dir / draft["subdir"]), "CPU", **self.draft_properties)
        self.pipeline = ov_genai.ContinuousBatchingPipeline(str(engine_dir), scheduler, "CPU", properties)
        warm_up_and_commit(self.pipeline, ov_genai, scheduler.max_num_seqs, self.num_assistant_tokens)  # as the engine model does at load
        self.ov_genai = ov_genai
        # stop where the served model stops: at the checkpoint's EOS (the engine model's default end_id)
        generation = json.loads((engine_dir / "generation_config.json").read_text())
        eos = generation.get("eos_token_id")
        self.eos = int(eos[0] if isinstance(eos, list) else eos) if eos is not None else None

    def generate(self, ids: list[int], max_tokens: int) -> tuple[list[int], float, dict[str, Any]]:
        import numpy as np
        import openvino as ov

        config = self.ov_genai.GenerationConfig()
        config.max_new_tokens, config.do_sample = max_tokens, False
        if self.eos is not None:
            config.eos_token_id = self.eos
            config.stop_token_ids = {self.eos}
        if self.num_assistant_tokens:
            config.num_assistant_tokens = self.num_assistant_tokens
        started = time.perf_counter()
        result = self.pipeline.generate([ov.Tensor(np.asarray([ids], dtype=np.int64))], [config])[0]
        seconds = time.perf_counter() - started
        steps: dict[str, Any] = {}
        extended = result.extended_perf_metrics
        if self.num_assistant_tokens and extended is not None:
            # The first step of each model is the prompt; the rest are decode steps (ms).
            steps["verify_ms"] = [d / 1e3 for d in list(extended.main_model_metrics.raw_metrics.m_durations)[1:]]
            steps["draft_token_ms"] = [d / 1e3 for d in list(extended.draft_model_metrics.raw_metrics.m_durations)[1:]]
            steps["accepted"] = int(extended.get_num_accepted_tokens())
            steps["drafted"] = int(extended.get_num_draft_tokens())
        else:
            steps["decode_ms"] = [d / 1e3 for d in list(result.perf_metrics.raw_metrics.m_durations)[1:]]
        return [int(t) for t in result.m_generation_ids[0]], seconds, steps


def per_step_costs(steps: dict[str, list[dict[str, Any]]], outputs: dict[str, list[list[int]]]) -> dict[str, Any]:
    """Medians of the per-step times GenAI measured, as multiples of the target's own decode step."""
    decode = statistics.median(ms for s in steps["in-process alone"] for ms in s["decode_ms"])
    costs: dict[str, Any] = {"target_decode_ms": decode}
    for key in ("in-process draft", "in-process draft, target's threads"):
        draft_ms = statistics.median(ms for s in steps[key] for ms in s["draft_token_ms"])
        verify_ms = statistics.median(ms for s in steps[key] for ms in s["verify_ms"])
        accepted, drafted = sum(s["accepted"] for s in steps[key]), sum(s["drafted"] for s in steps[key])
        verifies = sum(len(s["verify_ms"]) for s in steps[key])
        decoded = sum(len(t) - 1 for t in outputs[key])  # the first token comes from the prompt step
        costs[key] = {
            "draft_token_ms": draft_ms,
            "verify_ms": verify_ms,
            "draft_token_vs_target": draft_ms / decode,
            "verify_vs_target": verify_ms / decode,
            "accepted_share": accepted / drafted if drafted else 0.0,
            "tokens_per_step": decoded / verifies if verifies else 0.0,
        }
    return costs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=REPO / "configs" / "smollm2-cpu.yaml")
    parser.add_argument("--root", type=Path, default=Path("forge-work") / "bench-spec")
    parser.add_argument("--checkpoint", type=Path, help="HF checkpoint; default: import the config's model.source.")
    parser.add_argument("--draft-len", type=int, default=5, help="engine.speculative.max_draft_len")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--json", dest="json_out", type=Path, default=RESULTS)
    parser.add_argument("--note", help="stored with the results, e.g. what else ran on the machine")
    args = parser.parse_args(argv)
    document = provenance.record()

    from transformers import AutoTokenizer
    from trtllm_forge.builders.openvino.builder import build_engine

    from trtllm_forge.client import stream_request
    from trtllm_forge.config import load_config
    from trtllm_forge.deploy import start_server, stop_server
    from trtllm_forge.render.repository import render_repository
    from trtllm_forge.sample_prompts import PROMPTS

    base = load_config(args.config)
    root = args.root.resolve()
    checkpoint = args.checkpoint
    if checkpoint is None:
        from trtllm_forge.importer.stage import import_checkpoint

        checkpoint = import_checkpoint(base, root / "import").checkpoint_dir
    checkpoint = Path(checkpoint).resolve()
    tokenizer = AutoTokenizer.from_pretrained(str(checkpoint))
    prompt_ids = [tokenizer(p)["input_ids"] for p in PROMPTS[: args.prompts]]
    kv_tokens = base.runtime.max_tokens_in_paged_kv_cache or base.engine.max_batch_size * base.engine.max_seq_len

    spec = {"mode": "draft_target", "max_draft_len": args.draft_len, "draft_model": str(checkpoint)}
    configs = {"alone": variant(base, "bench-spec-alone", None), "draft": variant(base, "bench-spec-draft", spec)}
    deployments = {}
    engines: dict[str, Path] = {}
    try:
        for key, config in configs.items():
            workdir = root / key
            info(f"building {key} in {workdir} …")
            engine_dir = build_engine(config, workdir, checkpoint).engine_dir
            assert engine_dir is not None
            engines[key] = engine_dir
            render_repository(config, workdir, engines[key])
            deployments[key] = start_server(config, workdir)
        name = base.triton.model_names.tensorrt_llm
        local = {
            "in-process alone": InProcess(engines["alone"], kv_tokens),
            "in-process draft": InProcess(engines["draft"], kv_tokens),
            # the same draft compiled with the target's properties only (both threads)
            "in-process draft, target's threads": InProcess(engines["draft"], kv_tokens, draft_properties={}),
        }

        def served(key: str, ids: list[int]) -> tuple[list[int], float, dict]:
            values = {"input_ids": ids, "input_lengths": [len(ids)], "request_output_len": [args.max_tokens], "streaming": [False]}
            started = time.perf_counter()
            result = stream_request(deployments[key], name, values)
            seconds = time.perf_counter() - started
            return [int(t) for r in result.responses for t in r["output_ids"].reshape(-1)], seconds, {}

        runs: dict[str, Callable[[list[int]], tuple[list[int], float, dict]]] = {
            "served alone": lambda ids: served("alone", ids),
            "served draft": lambda ids: served("draft", ids),
        }
        for key, engine in local.items():
            runs[key] = partial(engine.generate, max_tokens=args.max_tokens)
        for run in runs.values():  # warm-up
            run(prompt_ids[0][:8])
        outputs: dict[str, list[list[int]]] = {k: [] for k in runs}
        seconds = {k: 0.0 for k in runs}
        steps: dict[str, list[dict]] = {k: [] for k in runs}
        for i, ids in enumerate(prompt_ids):
            order = list(runs) if i % 2 == 0 else list(reversed(runs))
            for key in order:
                tokens, took, measured = runs[key](ids)
                outputs[key].append(tokens)
                seconds[key] += took
                steps[key].append(measured)
        tok_s = {k: sum(map(len, outputs[k])) / seconds[k] for k in runs}
        reference = outputs["served alone"]
        identical = {k: sum(a == b for a, b in zip(reference, outputs[k], strict=False)) for k in runs if k != "served alone"}
        costs = per_step_costs(steps, outputs)
        draft_properties = local["in-process draft"].draft_properties
    finally:
        for deployment in deployments.values():
            stop_server(deployment, quiet=True)

    document.update(
        meta={
            "prompts": len(prompt_ids),
            "max_tokens": args.max_tokens,
            "draft_len": args.draft_len,
            "draft": "int8 export of the same checkpoint",
            "draft_properties": draft_properties,
        },
        tok_s=tok_s,
        ratio=tok_s["served draft"] / tok_s["served alone"],
        ratio_in_process=tok_s["in-process draft"] / tok_s["in-process alone"],
        ratio_in_process_target_threads=tok_s["in-process draft, target's threads"] / tok_s["in-process alone"],
        served_vs_in_process={k: tok_s[f"served {k}"] / tok_s[f"in-process {k}"] for k in ("alone", "draft")},
        identical=identical,
        per_step=costs,
    )
    if args.note:
        document["note"] = args.note
    provenance.write_result(args.json_out, provenance.finish(document))
    print(render_table(document))
    info(f"wrote {args.json_out}")
    return 0


def render_table(document: dict[str, Any]) -> str:
    """The README table, from a result file alone, with the goal's verdict and the measured why."""
    meta, tok_s, ratio = document["meta"], document["tok_s"], document["ratio"]
    identical, costs = document["identical"], document["per_step"]
    n = meta["prompts"]
    props = ", ".join(f"{k}={v}" for k, v in (meta.get("draft_properties") or {}).items())

    def row(label: str, key: str, base: str) -> str:
        same = f"{identical[key]}/{n}" if key in identical else "reference"
        return f"| {label} | {tok_s[key]:.1f} | {tok_s[key] / tok_s[base]:.2f}× | {same} |"

    lines = [
        f"Batch 1, {n} prompts × {meta['max_tokens']} tokens, greedy, not streamed: the `tensorrt_llm` model of two servers and "
        f"the same engine directories in process, asked in turn; draft: {meta['draft']}, {meta['draft_len']} drafted tokens per "
        f"step, compiled with {props}. " + provenance.measured_where(document),
        "",
        "| engine | output tok/s | vs alone | prompts with tokens identical to served alone |",
        "|---|---:|---:|---:|",
        row("served fp32 alone", "served alone", "served alone"),
        row("served fp32 + int8 draft", "served draft", "served alone"),
        row("in process fp32 alone", "in-process alone", "in-process alone"),
        row("in process fp32 + int8 draft", "in-process draft", "in-process alone"),
        row("in process fp32 + int8 draft on the target's threads", "in-process draft, target's threads", "in-process alone"),
        "",
        f"Per step (GenAI's own timings, medians; the target decodes one token in {costs['target_decode_ms']:.1f} ms):",
        "",
        "| draft compiled | draft token | target verifies K+1 | drafted tokens accepted | tokens per step |",
        "|---|---:|---:|---:|---:|",
    ]
    for key, label in (("in-process draft", props or "as the target"), ("in-process draft, target's threads", "as the target")):
        c = costs[key]
        lines.append(
            f"| {label} | {c['draft_token_ms']:.1f} ms ({c['draft_token_vs_target']:.2f}× target) | {c['verify_ms']:.1f} ms "
            f"({c['verify_vs_target']:.2f}×) | {100 * c['accepted_share']:.0f}% | {c['tokens_per_step']:.2f} |"
        )
    met = ratio >= GOAL_RATIO and identical.get("served draft") == n
    lines += [
        "",
        f"Served with the draft / served alone: {ratio:.2f}× (in process {document['ratio_in_process']:.2f}×); goal ≥ {GOAL_RATIO}× "
        f"with identical tokens: {'met' if met else 'not met'} in this run.",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
