#!/usr/bin/env python
"""Speculative decoding served on CPU: the fp32 engine alone vs the same engine with an int8 draft of itself
(engine.speculative draft_target), both behind a real Triton, at batch 1 (one request at a time).

Each prompt is sent to the `tensorrt_llm` model of both servers in turn (interleaved, so both see the same
machine load), greedy, token ids in and out, not streamed. Reported: output tokens/s of each, their ratio
(goal >= 1.3x) and how many prompts' tokens are identical with and without the draft (goal: all).

    python scripts/bench_cpu_speculative.py [--config configs/smollm2-cpu.yaml] [--root forge-work/bench-spec]
        [--checkpoint DIR] [--draft-len 3] [--prompts 8] [--max-tokens 64] [--json results/bench_cpu_speculative/run.json]

Engines are built (and cached) under --root with the project's own stages; nothing is downloaded.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=REPO / "configs" / "smollm2-cpu.yaml")
    parser.add_argument("--root", type=Path, default=Path("forge-work") / "bench-spec")
    parser.add_argument("--checkpoint", type=Path, help="HF checkpoint; default: import the config's model.source.")
    parser.add_argument("--draft-len", type=int, default=3, help="engine.speculative.max_draft_len")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--json", dest="json_out", type=Path, default=RESULTS)
    parser.add_argument("--note", help="stored with the results, e.g. what else ran on the machine")
    args = parser.parse_args(argv)
    document = provenance.record()

    from transformers import AutoTokenizer

    from trtllm_forge.builders.openvino import build_engine
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

    spec = {"mode": "draft_target", "max_draft_len": args.draft_len, "draft_model": str(checkpoint)}
    configs = {"alone": variant(base, "bench-spec-alone", None), "draft": variant(base, "bench-spec-draft", spec)}
    deployments = {}
    try:
        for key, config in configs.items():
            workdir = root / key
            info(f"building {key} in {workdir} …")
            engine_dir = build_engine(config, workdir, checkpoint).engine_dir
            render_repository(config, workdir, engine_dir)
            deployments[key] = start_server(config, workdir)
        name = base.triton.model_names.tensorrt_llm

        def once(key: str, ids: list[int]) -> tuple[list[int], float]:
            values = {"input_ids": ids, "input_lengths": [len(ids)], "request_output_len": [args.max_tokens], "streaming": [False]}
            started = time.perf_counter()
            result = stream_request(deployments[key], name, values)
            seconds = time.perf_counter() - started
            return [int(t) for r in result.responses for t in r["output_ids"].reshape(-1)], seconds

        for key in deployments:  # warm-up
            once(key, prompt_ids[0][:8])
        outputs: dict[str, list[list[int]]] = {k: [] for k in deployments}
        seconds = {k: 0.0 for k in deployments}
        for i, ids in enumerate(prompt_ids):
            order = list(deployments) if i % 2 == 0 else list(reversed(deployments))
            for key in order:
                tokens, took = once(key, ids)
                outputs[key].append(tokens)
                seconds[key] += took
        tok_s = {k: sum(map(len, outputs[k])) / seconds[k] for k in deployments}
        identical = sum(a == b for a, b in zip(outputs["alone"], outputs["draft"]))
    finally:
        for deployment in deployments.values():
            stop_server(deployment, quiet=True)

    document.update(
        meta={
            "prompts": len(prompt_ids),
            "max_tokens": args.max_tokens,
            "draft_len": args.draft_len,
            "draft": "int8 export of the same checkpoint",
        },
        tok_s=tok_s,
        ratio=tok_s["draft"] / tok_s["alone"],
        identical=identical,
    )
    if args.note:
        document["note"] = args.note
    provenance.write_result(args.json_out, provenance.finish(document))
    print(render_table(document))
    info(f"wrote {args.json_out}")
    return 0


def render_table(document: dict[str, Any]) -> str:
    """The README table, from a result file alone, with the goals' verdicts."""
    meta, tok_s, ratio = document["meta"], document["tok_s"], document["ratio"]
    return (
        "\n".join(
            [
                f"Batch 1, {meta['prompts']} prompts × up to {meta['max_tokens']} tokens, greedy, not streamed, the `tensorrt_llm` model of "
                f"two servers asked in turn; draft: {meta['draft']}, {meta['draft_len']} drafted tokens per step. "
                + provenance.measured_where(document),
                "",
                "| engine | output tok/s | vs alone | prompts with identical tokens |",
                "|---|---:|---:|---:|",
                f"| fp32 alone | {tok_s['alone']:.1f} | 1.00× | |",
                f"| fp32 + int8 draft | {tok_s['draft']:.1f} | {ratio:.2f}× | {document['identical']}/{meta['prompts']} |",
                "",
                f"Goal ≥ {GOAL_RATIO}× with identical tokens: {'met' if ratio >= GOAL_RATIO and document['identical'] == meta['prompts'] else 'not met'} in this run.",
            ]
        )
        + "\n"
    )


if __name__ == "__main__":
    sys.exit(main())
