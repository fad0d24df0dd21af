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
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


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
    parser.add_argument("--json", dest="json_out", type=Path, help="Write the results here (default <root>/bench.json).")
    args = parser.parse_args(argv)

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
        from trtllm_forge.importer.stage import checkpoint_dir_of, import_checkpoint

        checkpoint = checkpoint_dir_of(import_checkpoint(base, root / "import"))
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
            engine_dir = Path(build_engine(config, workdir, checkpoint).manifest["outputs"]["engine_dir"])
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

    ratio = tok_s["draft"] / tok_s["alone"]
    goals = [
        f"{'PASS' if ratio >= 1.3 else 'MISS'}: served batch 1 with the int8 draft >= 1.3x without ({ratio:.2f}x)",
        f"{'PASS' if identical == len(prompt_ids) else 'MISS'}: tokens identical with and without the draft ({identical}/{len(prompt_ids)})",
    ]
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    result = {
        "meta": {
            "git_commit": commit,
            "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "prompts": len(prompt_ids),
            "max_tokens": args.max_tokens,
            "draft_len": args.draft_len,
            "draft": "int8 export of the same checkpoint",
        },
        "tok_s": tok_s,
        "ratio": ratio,
        "identical": identical,
        "goals": goals,
    }
    print(
        f"alone {tok_s['alone']:.1f} tok/s, with draft {tok_s['draft']:.1f} tok/s ({ratio:.2f}x); identical {identical}/{len(prompt_ids)}"
    )
    for goal in goals:
        print(f"- {goal}")
    out = args.json_out or root / "bench.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    info(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
