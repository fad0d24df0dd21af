#!/usr/bin/env python
"""Smooth streams on CPU: inter-token latency against TPOT on the three entry points, side by side.

Runs `trtllm-forge bench` (our gRPC load generator) at concurrency 8, 64 tokens in and 64 out, streamed, against
the `tensorrt_llm` model directly (token ids), the ensemble and the BLS of one or more running deployments,
interleaved (model by model, deployment by deployment, so all see the same machine load). Goal (issue 16.2):
ITL p99 <= 1.5x TPOT p50 on each entry point.

    python scripts/bench_cpu_streaming.py LABEL=WORKDIR [LABEL=WORKDIR ...] [--config configs/smollm2-cpu.yaml]
        [--concurrency 8] [--num-requests 16] [--rounds 1] [--json results/bench_cpu_streaming/run.json]

Each WORKDIR is a deployment started with `trtllm-forge deploy` (e.g. one rendered from main, one from a
branch); the script does not start or stop servers.
"""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from trtllm_forge.bench import provenance

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "results" / "bench_cpu_streaming" / "streaming.json"
ENTRY_POINTS = (("tensorrt_llm", "triton-grpc-tokens"), ("ensemble", "triton-grpc"), ("tensorrt_llm_bls", "triton-grpc"))
GOAL_RATIO = 1.5


def bench(config: Path, workdir: Path, model: str, target: str, args: argparse.Namespace, out: Path) -> dict:
    argv = [
        sys.executable, "-m", "trtllm_forge", "bench", "run", str(config), "--workdir", str(workdir),
        "--target", target, "--model", model, "--concurrency", str(args.concurrency),
        "--input-len", "64", "--output-len", "64", "--num-requests", str(args.num_requests), "--warmup", "2",
        "--no-plots", "--out", str(out), "--json",
    ]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines()
        return {"error": lines[-1] if lines else f"exit {done.returncode}"}
    metrics = json.loads(done.stdout)["metrics"]

    def pick(name: str, stat: str) -> float:
        return float((metrics.get(name) or {}).get(stat) or "nan")

    itl_p99, tpot_p50 = pick("itl_ms", "p99"), pick("tpot_ms", "p50")
    return {
        **slow_gaps(out / "requests.jsonl", GOAL_RATIO * tpot_p50 * 1e6),
        "output_tok_s": pick("output_token_throughput_per_s", "avg"),
        "itl_p50_ms": pick("itl_ms", "p50"),
        "itl_p90_ms": pick("itl_ms", "p90"),
        "itl_p99_ms": itl_p99,
        "tpot_p50_ms": tpot_p50,
        "ttft_p50_ms": pick("ttft_ms", "p50"),
        "itl_p99_over_tpot_p50": itl_p99 / tpot_p50,
    }


def slow_gaps(records: Path, limit_ns: float) -> dict:
    """Where the gaps above the goal come from. A gap that other streams' gaps cover at the same time (3 or more,
    each also slow) is a slow engine step (CPU contention, a prefill): every stream waited. A gap no other stream
    shares is a token held back on its own way out (a queue in the server, the ensemble's postprocessing, a BLS
    stub), which shows only on the entry points that add such a hop."""
    if not records.is_file():
        return {}
    gaps: list[tuple[int, int]] = []  # (start, end) of each inter-token gap, all measured requests
    for line in records.read_text().splitlines():
        record = json.loads(line)
        if record.get("phase") == "warmup":
            continue
        stamps = [r["recv_ns"] for r in record.get("responses") or [] if r.get("tokens")]
        gaps.extend(itertools.pairwise(stamps))
    slow = [g for g in gaps if g[1] - g[0] > limit_ns]

    def shared(gap: tuple[int, int]) -> bool:
        margin = (gap[1] - gap[0]) // 5
        others = [o for o in gaps if o is not gap and o[0] <= gap[0] + margin and o[1] >= gap[1] - margin]
        return sum(1 for o in others if o[1] - o[0] > 0.8 * limit_ns) >= 3

    in_steps = sum(1 for g in slow if shared(g))
    return {"gaps_over_goal": len(slow), "gaps_over_goal_in_slow_steps": in_steps, "gaps_over_goal_alone": len(slow) - in_steps}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("deployments", nargs="+", help="LABEL=WORKDIR of a running deployment")
    parser.add_argument("--config", type=Path, default=REPO / "configs" / "smollm2-cpu.yaml")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--num-requests", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--entry-points", default=",".join(m for m, _ in ENTRY_POINTS), help="Comma-separated models to measure.")
    parser.add_argument("--json", dest="json_out", type=Path, default=RESULTS)
    parser.add_argument("--note", help="stored with the results, e.g. what else ran on the machine")
    args = parser.parse_args(argv)
    deployments = dict(item.split("=", 1) for item in args.deployments)
    wanted = set(args.entry_points.split(","))

    document = provenance.record()
    document["meta"] = {
        "workload": f"concurrency {args.concurrency}, 64 tokens in, 64 out, streamed, {args.num_requests} requests",
        "deployments": deployments,
        "goal": f"ITL p99 <= {GOAL_RATIO}x TPOT p50",
    }
    if args.note:
        document["note"] = args.note
    rows: list[dict[str, Any]] = document.setdefault("rows", [])
    scratch = args.json_out.parent / "runs"
    for round_ in range(args.rounds):
        for model, target in [e for e in ENTRY_POINTS if e[0] in wanted]:
            for label, workdir in deployments.items():
                result = bench(args.config, Path(workdir), model, target, args, scratch / f"{label}-{model}-{round_}")
                row = {"deployment": label, "entry_point": model, "round": round_, **result}
                rows.append(row)
                provenance.write_result(args.json_out, document)  # after every row: an interrupted run keeps what it measured
                if "error" in row:
                    print(f"{label:>10} {model:<17} failed: {row['error']}", flush=True)
                    continue
                print(
                    f"{label:>10} {model:<17} {row['output_tok_s']:7.1f} tok/s  ITL p50 {row['itl_p50_ms']:7.1f} p90 "
                    f"{row['itl_p90_ms']:7.1f} p99 {row['itl_p99_ms']:7.1f}  TPOT p50 {row['tpot_p50_ms']:7.1f}  "
                    f"p99/TPOT {row['itl_p99_over_tpot_p50']:.2f}",
                    flush=True,
                )
    provenance.write_result(args.json_out, provenance.finish(document))
    print(render_table(document))
    print(f"wrote {args.json_out}", file=sys.stderr)
    return 0


def render_table(document: dict[str, Any]) -> str:
    """The README table, from a result file alone: one row per entry point, deployment and round."""
    lines = [
        f"{document['meta']['workload']}; goal {document['meta']['goal']}. " + provenance.measured_where(document),
        "",
        "| entry point | deployment | output tok/s | ITL p50 ms | ITL p90 ms | ITL p99 ms | TPOT p50 ms | ITL p99 / TPOT p50 "
        "| gaps over the goal: in slow engine steps / alone |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in document["rows"]:
        head = f"| `{row['entry_point']}` | {row['deployment']} |"
        if "error" in row:
            lines.append(f"{head} failed: {row['error']} | | | | | | |")
            continue
        gaps = f"{row['gaps_over_goal_in_slow_steps']} / {row['gaps_over_goal_alone']}" if "gaps_over_goal" in row else ""
        lines.append(
            f"{head} {row['output_tok_s']:.1f} | {row['itl_p50_ms']:.1f} | {row['itl_p90_ms']:.1f} | {row['itl_p99_ms']:.1f} | "
            f"{row['tpot_p50_ms']:.1f} | {row['itl_p99_over_tpot_p50']:.2f} | {gaps} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
