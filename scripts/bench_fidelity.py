#!/usr/bin/env python3
"""Benchmark of the benchmark: how exactly does `trtllm-forge bench` measure?

Serves the timing model (a Triton python-backend model speaking the ensemble's text contract with a known
token schedule) on a real tritonserver from the nvidia-pytriton wheel, runs `bench` against it, and compares
what bench reports with the truth:

- configured: the TTFT and token gap the model was told to produce;
- reference: the model's own send stamps (CLOCK_MONOTONIC, the clock bench stamps with), i.e. what an ideal
  client with zero delivery and stamping delay would report: reference TTFT = first send stamp − bench's
  send time; reference gap = difference of consecutive send stamps.

Part 1 measures TTFT and gap p50 at concurrency 1, 16, 64 and 256. Part 2 floods (tokens back to back) and
reports the response rate the client consumed, the share of zero gaps and the per-response timing error
(receive stamp − send stamp). Prints Markdown tables; --json writes everything to a file too.

    .venv/bin/python scripts/bench_fidelity.py [--quick] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

from trtllm_forge.bench.local_triton import render_timing_model, start_triton
from trtllm_forge.bench.records import read_jsonl
from trtllm_forge.bench.run import BenchOptions, run_bench
from trtllm_forge.bench.workload import LengthSpec

TTFT_MS, GAP_MS, TOKENS = 50.0, 25.0, 16
FLOOD_TOKENS = 256


def _run(server, model: str, concurrency: int, n: int, tokens: int, out: Path, streams: int = 1, workers: int = 1) -> tuple[dict, list]:
    options = BenchOptions(
        target="triton-grpc",
        url=server.grpc_url,
        model=model,
        concurrency=[concurrency],
        num_requests=n,
        warmup_requests=min(concurrency, 8),
        input_len=LengthSpec(16),
        output_len=LengthSpec(tokens),
        out=out,
        streams=streams,
        workers=workers,
    )
    summary = run_bench(options)
    records = [r for r in read_jsonl(out / "requests.jsonl") if r.phase == "measure" and r.ok]
    return summary, records


def _reference(records) -> dict:
    ttft, gaps, lag, zero, n_gaps, responses = [], [], [], 0, 0, 0
    for r in records:
        recv = [t for t, k in zip(r.recv_ns, r.tokens) if k > 0]
        send = r.server_send_ns
        if len(send) != len(recv) or not send:
            continue
        ttft.append((send[0] - r.sent_ns) / 1e6)
        gaps.extend(np.diff(send) / 1e6)
        lag.extend((np.array(recv) - np.array(send)) / 1e6)
        d = np.diff(recv)
        zero += int(np.count_nonzero(d <= 0))
        n_gaps += d.size
        responses += len(recv)
    return {
        "ttft_p50": float(np.median(ttft)),
        "gap_p50": float(np.median(gaps)),
        "lag_p50": float(np.percentile(lag, 50)),
        "lag_p99": float(np.percentile(lag, 99)),
        "lag_under_1ms": float(np.mean(np.array(lag) < 1.0)),
        "zero_gap_share": zero / n_gaps if n_gaps else 0.0,
        "responses": responses,
    }


def _pct(ours: float, ref: float) -> str:
    return f"{(ours - ref) / ref * 100:+.1f}%"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer requests per point")
    parser.add_argument("--concurrency", default="1,16,64,256")
    parser.add_argument("--flood-concurrency", default="1,4,16,64")
    parser.add_argument("--flood-instances", type=int, default=2, help="instances (stub processes) of the flood model")
    parser.add_argument("--workers", type=int, default=1, help="client processes bench shards the load over")
    parser.add_argument("--streams", type=int, default=None, help="gRPC streams bench spreads requests over (default: bench's auto)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="bench-fidelity-"))
    render_timing_model(root / "repo", "ensemble", ttft_ms=TTFT_MS, gap_ms=GAP_MS)
    render_timing_model(root / "repo", "flood", ttft_ms=1.0, gap_ms=0.0, instances=args.flood_instances)
    server = start_triton(root / "repo", root)
    results: dict = {
        "machine": {"cpus": len(os.sched_getaffinity(0)), "load_avg_start": os.getloadavg()},
        "timing": {"ttft_ms": TTFT_MS, "gap_ms": GAP_MS, "tokens": TOKENS},
        "accuracy": [],
        "flood": [],
    }
    try:
        for c in (int(x) for x in args.concurrency.split(",")):
            n = max(24, 2 * c) if not args.quick else max(8, c)
            summary, records = _run(server, "ensemble", c, n, TOKENS, root / f"acc-c{c}", args.streams, args.workers)
            ref = _reference(records)
            m = summary["metrics"]
            results["accuracy"].append(
                {
                    "concurrency": c,
                    "requests": len(records),
                    "ours_ttft_p50": m["ttft_ms"]["p50"],
                    "ref_ttft_p50": ref["ttft_p50"],
                    "ours_itl_p50": m["itl_ms"]["p50"],
                    "ref_gap_p50": ref["gap_p50"],
                    "lag_p50": ref["lag_p50"],
                    "lag_p99": ref["lag_p99"],
                    "client_cpu": summary["self_checks"]["client_cpu_busy_share"],
                    "loop_lag_p99": m["event_loop_lag_ms"]["p99"],
                    "response_rate": ref["responses"] / summary["windows"]["benchmark"]["seconds"],
                }
            )
        for c in (int(x) for x in args.flood_concurrency.split(",")):
            n = max(8, 4 * c) if not args.quick else max(4, c)
            summary, records = _run(server, "flood", c, n, FLOOD_TOKENS, root / f"flood-c{c}", args.streams, args.workers)
            ref = _reference(records)
            results["flood"].append(
                {
                    "concurrency": c,
                    "responses": ref["responses"],
                    "responses_per_s": ref["responses"] / summary["windows"]["benchmark"]["seconds"],
                    "zero_gap_share": ref["zero_gap_share"],
                    "lag_p50": ref["lag_p50"],
                    "lag_p99": ref["lag_p99"],
                    "lag_under_1ms": ref["lag_under_1ms"],
                    "client_cpu": summary["self_checks"]["client_cpu_busy_share"],
                    "loop_lag_p99": summary["metrics"]["event_loop_lag_ms"]["p99"],
                }
            )
    finally:
        server.stop()
    results["machine"]["load_avg_end"] = os.getloadavg()

    print(f"\nbench client: {args.workers} process(es), {args.streams or 'auto (1 per request in flight, at most 64)'} gRPC stream(s)")
    print(
        f"\nTiming model: TTFT {TTFT_MS:g} ms, gap {GAP_MS:g} ms, {TOKENS} tokens; {results['machine']['cpus']} CPUs, "
        f"load average at start {results['machine']['load_avg_start'][0]:.2f}\n"
    )
    print(
        "| concurrency | requests | responses/s | TTFT p50 ours (ms) | TTFT p50 reference | error | ITL p50 ours (ms) | gap p50 reference | error | stamp lag p50 / p99 (ms) | event-loop lag p99 (ms) | client CPU |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for a in results["accuracy"]:
        print(
            f"| {a['concurrency']} | {a['requests']} | {a['response_rate']:,.0f} | {a['ours_ttft_p50']:.2f} | {a['ref_ttft_p50']:.2f} | "
            f"{_pct(a['ours_ttft_p50'], a['ref_ttft_p50'])} | {a['ours_itl_p50']:.2f} | {a['ref_gap_p50']:.2f} | "
            f"{_pct(a['ours_itl_p50'], a['ref_gap_p50'])} | {a['lag_p50']:.2f} / {a['lag_p99']:.2f} | {a['loop_lag_p99']:.2f} | {a['client_cpu']:.0%} |"
        )
    print(f"\nFlood model: {FLOOD_TOKENS} tokens back to back per request\n")
    print(
        "| concurrency | responses | responses/s consumed | zero gaps | stamp lag p50 / p99 (ms) | responses stamped < 1 ms after send | event-loop lag p99 (ms) | client CPU |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for f in results["flood"]:
        print(
            f"| {f['concurrency']} | {f['responses']:,} | {f['responses_per_s']:,.0f} | {f['zero_gap_share']:.2%} | "
            f"{f['lag_p50']:.2f} / {f['lag_p99']:.2f} | {f['lag_under_1ms']:.1%} | {f['loop_lag_p99']:.2f} | {f['client_cpu']:.0%} |"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
