#!/usr/bin/env python3
"""Who measures right? trtllm-forge bench, perf_analyzer and GenAI-Perf on the same server, interleaved.

Serves the timing model (a Triton python-backend model with the ensemble's text contract that streams tokens
on a known schedule: first token TTFT ms after arrival, then one every GAP ms) on the real tritonserver, then
for each repeat and each concurrency runs, back to back, our bench, perf_analyzer 2.51 (`bench --tool
perf_analyzer`) and GenAI-Perf (`bench --tool genai-perf`, when FORGE_GENAI_PERF points at it) with the same
workload, each through the CLI in its own process. Runs taken at different times are never compared: every row of the table is the median over
repeats of runs that were interleaved. Truth: the configured TTFT and gap (the server can only be late, never
early); E2E truth = TTFT + (OSL − 1) × gap.

Writes results/bench_fidelity/tools.json (git commit, machine, load average, every run) and, with
--readme, regenerates the README table between the `tools-fidelity` markers from that file.

    .venv/bin/python scripts/bench_tools_fidelity.py [--repeats 3] [--concurrency 1,4,16] [--readme]
    .venv/bin/python scripts/bench_tools_fidelity.py --readme-only   # table from the committed file
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from trtllm_forge.bench.provenance import git_commit, machine

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "results" / "bench_fidelity" / "tools.json"
README = REPO / "README.md"
MARKERS = ("<!-- tools-fidelity:start -->", "<!-- tools-fidelity:end -->")
TTFT_MS, GAP_MS, OSL, ISL = 40.0, 10.0, 16, 32
METRICS = (("ttft_ms", "p50"), ("tpot_ms", "p50"), ("itl_ms", "p50"), ("e2e_ms", "p50"))


def _one(tool: str, server, concurrency: int, n: int, out: Path, tokenizer: Path | None) -> dict:
    """One run through the CLI, each tool in its own process, as a user runs it."""
    argv = [
        sys.executable,
        "-m",
        "trtllm_forge",
        "bench",
        "--url",
        server.grpc_url,
        "--model",
        "ensemble",
        "--concurrency",
        str(concurrency),
        "--num-requests",
        str(n),
        "--warmup",
        str(min(concurrency, 4)),
        "--input-len",
        str(ISL),
        "--output-len",
        str(OSL),
        "--request-timeout",
        "60",
        "--no-plots",
        "--out",
        str(out),
        "--json",
    ]
    if tokenizer is not None:
        argv += ["--tokenizer", str(tokenizer)]
    if tool != "trtllm-forge":
        argv += ["--tool", tool]
    started = time.time()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}")
    summary = json.loads(proc.stdout)
    m = summary["metrics"]
    row = {
        "tool": tool,
        "concurrency": concurrency,
        "requests": summary["requests"].get("completed"),
        "wall_s": time.time() - started,
        "load_average_after": os.getloadavg()[0],
    }
    for name, stat in METRICS:
        row[f"{name}_{stat}"] = (m.get(name) or {}).get(stat)
    row["request_throughput_per_s"] = (m.get("request_throughput_per_s") or {}).get("avg")
    row["output_tokens_avg"] = (m.get("output_tokens") or {}).get("avg")
    row["client_cpu_busy_share"] = (summary.get("self_checks") or {}).get("client_cpu_busy_share")
    return row


def run(repeats: int, concurrencies: list[int], n_per_concurrency: int, tokenizer: Path | None) -> dict:
    from trtllm_forge.bench.local_triton import render_timing_model, start_triton
    from trtllm_forge.bench.perf_analyzer import problem

    tools = ["trtllm-forge"]
    skipped = {}
    if problem() is None:
        tools.append("perf_analyzer")
    else:
        skipped["perf_analyzer"] = problem()
    if os.environ.get("FORGE_GENAI_PERF") and tokenizer is not None:
        tools.append("genai-perf")
    else:
        skipped["genai-perf"] = "FORGE_GENAI_PERF or --tokenizer not given"
    document = {
        "schema": "trtllm-forge.bench-tools-fidelity/1",
        "git_commit": git_commit(),
        "machine": machine(),
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "timing_model": {"ttft_ms": TTFT_MS, "gap_ms": GAP_MS, "output_tokens": OSL, "input_tokens": ISL},
        "truth": {"ttft_ms": TTFT_MS, "itl_ms": GAP_MS, "tpot_ms": GAP_MS, "e2e_ms": TTFT_MS + (OSL - 1) * GAP_MS},
        "tools": tools,
        "skipped": skipped,
        "repeats": repeats,
        "runs": [],
    }
    with tempfile.TemporaryDirectory(prefix="tools-fidelity-") as tmp:
        root = Path(tmp)
        render_timing_model(root / "repo", "ensemble", ttft_ms=TTFT_MS, gap_ms=GAP_MS)
        server = start_triton(root / "repo", root)
        try:
            for repeat in range(repeats):
                for concurrency in concurrencies:
                    order = tools[repeat % len(tools) :] + tools[: repeat % len(tools)]  # rotate who goes first
                    for tool in order:
                        n = max(n_per_concurrency, concurrency * 4)
                        try:
                            row = _one(tool, server, concurrency, n, root / f"{tool}-{repeat}-c{concurrency}", tokenizer)
                        except Exception as exc:  # noqa: BLE001 - one failed run is recorded, the others go on
                            row = {"tool": tool, "concurrency": concurrency, "error": f"{type(exc).__name__}: {exc}"}
                        row["repeat"] = repeat
                        document["runs"].append(row)
                        print(json.dumps(row), flush=True)
        finally:
            server.stop()
    document["finished_utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    document["machine"]["load_average_end"] = list(os.getloadavg())
    return document


def table(document: dict) -> str:
    """Markdown: per concurrency and tool, the median over repeats, and the error against the truth."""
    truth = document["truth"]
    lines = [
        f"Timing model: TTFT {truth['ttft_ms']:g} ms, gap {truth['itl_ms']:g} ms, {document['timing_model']['output_tokens']} tokens "
        f"(E2E truth {truth['e2e_ms']:g} ms); git {document['git_commit'][:12]}, {document['started_utc']}, "
        f"{document['machine']['cpus']} CPUs, load average {document['machine']['load_average'][0]:.1f} at start"
        + (f"; note: {document['note']}" if document.get("note") else ""),
        "",
        "| concurrency | tool | runs | TTFT p50 (ms) | error | TPOT p50 | error | ITL p50 | error | E2E p50 | error | req/s |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    keys = sorted({(r["concurrency"], r["tool"]) for r in document["runs"]}, key=lambda k: (k[0], document["tools"].index(k[1])))
    for concurrency, tool in keys:
        rows = [r for r in document["runs"] if r["concurrency"] == concurrency and r["tool"] == tool]
        cells = [str(concurrency), tool, str(len(rows))]
        for metric, truth_key in (
            ("ttft_ms_p50", "ttft_ms"),
            ("tpot_ms_p50", "tpot_ms"),
            ("itl_ms_p50", "itl_ms"),
            ("e2e_ms_p50", "e2e_ms"),
        ):
            values = [r[metric] for r in rows if r.get(metric) is not None]
            if not values:
                cells += ["-", "-"]
                continue
            value = statistics.median(values)
            cells += [f"{value:.2f}", f"{(value - truth[truth_key]) / truth[truth_key] * 100:+.1f}%"]
        rates = [r["request_throughput_per_s"] for r in rows if r.get("request_throughput_per_s")]
        cells.append(f"{statistics.median(rates):.1f}" if rates else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def update_readme(document: dict) -> None:
    text = README.read_text()
    start, end = MARKERS
    if start not in text or end not in text:
        raise SystemExit(f"README.md has no {start} ... {end} block")
    before, rest = text.split(start, 1)
    _, after = rest.split(end, 1)
    README.write_text(before + start + "\n" + table(document) + end + after)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--concurrency", default="1,4,16")
    parser.add_argument("--requests", type=int, default=24, help="requests per run (at least 4 x concurrency)")
    parser.add_argument("--tokenizer", type=Path, default=None, help="HF tokenizer dir (GenAI-Perf needs one)")
    parser.add_argument("--note", default=None, help="a note stored with the results (e.g. that the machine was loaded)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--readme", action="store_true", help="regenerate the README table from the new file")
    parser.add_argument("--readme-only", action="store_true", help="regenerate the README table from --out; run nothing")
    args = parser.parse_args()
    if args.readme_only:
        update_readme(json.loads(args.out.read_text()))
        return 0
    document = run(args.repeats, [int(c) for c in args.concurrency.split(",")], args.requests, args.tokenizer)
    if args.note:
        document["note"] = args.note
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(document, indent=2) + "\n")
    os.replace(tmp, args.out)
    print(table(document))
    if args.readme:
        update_readme(document)
    return 0


if __name__ == "__main__":
    sys.exit(main())
