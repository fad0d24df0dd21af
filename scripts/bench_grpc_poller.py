#!/usr/bin/env python3
"""Which grpc client poller lets our bench stamp responses soonest: grpc's older poller with its `poll` strategy (our
default, trtllm_forge.GRPC_DEFAULTS: the thread waiting on a stream reads that stream's own connection; a connection
per stream), grpcio's own default, the event-engine client (its threads read every socket and wake the thread waiting
on the call; 6 streams per connection), and the older poller with its `epoll1` strategy (one epoll set for the
process: whichever thread polls reads any socket and wakes the owner).

Our bench (`trtllm-forge bench`, its own process per run, as bench_tools_fidelity.py runs it) on the timing model
(TTFT error against the model's send stamps, concurrency 1, 4, 16, 64) and on the flood model (responses consumed
per second, concurrency 1, 16, 64), the settings interleaved (order reversed every repeat), one Triton for all.

    .venv/bin/python scripts/bench_grpc_poller.py [--repeats 3] [--note TEXT] [--out results/bench_fidelity/grpc_poller.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_tools_fidelity as fidelity  # noqa: E402 - the fidelity script's runs and stamp statistics

from trtllm_forge import OLDER_GRPC_POLLER  # noqa: E402
from trtllm_forge.bench import provenance  # noqa: E402

RESULTS = fidelity.REPO / "results" / "bench_fidelity" / "grpc_poller.json"
# The grpc environment of each setting (set for the bench process; a value set is not replaced by our defaults).
SETTINGS: dict[str, dict[str, str]] = {
    "older poller, poll": dict(OLDER_GRPC_POLLER),
    "event-engine client (grpcio default)": {"GRPC_EXPERIMENTS": "", "GRPC_POLL_STRATEGY": "epoll1,poll"},
    "older poller, epoll1": {"GRPC_EXPERIMENTS": "-event_engine_client", "GRPC_POLL_STRATEGY": "epoll1"},
}
GRPC_VARIABLES = tuple(OLDER_GRPC_POLLER)
TIMING_CONCURRENCY = (1, 4, 16, 64)
FLOOD_CONCURRENCY = (1, 16, 64)


def _run(setting: str, model: str, concurrency: int, n: int, osl: int, urls: dict[str, str], out: Path) -> dict[str, Any]:
    environment = SETTINGS[setting]
    os.environ.update(environment)  # inherited by the bench process
    row = fidelity.one_run("trtllm-forge", urls, model, concurrency, n, osl, out, None)
    return {"setting": setting, "grpc_environment": environment, "model": model, "concurrency": concurrency, **row}


def run(repeats: int) -> dict[str, Any]:
    from trtllm_forge.bench.local_triton import render_timing_model, start_triton

    document = provenance.record()
    document["schema"] = "trtllm-forge.bench-grpc-poller/1"
    document["timing_model"] = {"ttft_ms": fidelity.TTFT_MS, "gap_ms": fidelity.GAP_MS, "output_tokens": fidelity.OSL}
    document["flood_model"] = {"output_tokens": fidelity.FLOOD_OSL, "instances": fidelity.FLOOD_INSTANCES}
    document["repeats"] = repeats
    document["runs"] = []
    saved = {name: os.environ.get(name) for name in GRPC_VARIABLES}
    with tempfile.TemporaryDirectory(prefix="grpc-poller-") as tmp:
        root = Path(tmp)
        render_timing_model(root / "repo", "ensemble", ttft_ms=fidelity.TTFT_MS, gap_ms=fidelity.GAP_MS)
        render_timing_model(root / "repo", "flood", ttft_ms=1.0, gap_ms=0.0, instances=fidelity.FLOOD_INSTANCES)
        server = start_triton(root / "repo", root)
        urls = {"grpc": server.grpc_url, "http": server.http_url}
        try:
            for repeat in range(repeats):
                order = list(SETTINGS) if repeat % 2 == 0 else list(reversed(SETTINGS))
                points = [("ensemble", c, max(24, 4 * c), fidelity.OSL) for c in TIMING_CONCURRENCY]
                points += [("flood", c, max(8, 2 * c), fidelity.FLOOD_OSL) for c in FLOOD_CONCURRENCY]
                for model, concurrency, n, osl in points:
                    for setting in order:
                        out = root / f"{model}-{repeat}-c{concurrency}-{list(SETTINGS).index(setting)}"
                        row = _run(setting, model, concurrency, n, osl, urls, out)
                        row["repeat"] = repeat
                        document["runs"].append(row)
                        print(json.dumps(row), flush=True)
        finally:
            server.stop()
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
    return provenance.finish(document)


def _ttft_error(row: dict[str, Any]) -> float | None:
    if not row.get("ref_ttft_ms_p50") or not row.get("ttft_ms_p50"):
        return None
    return row["ttft_ms_p50"] / row["ref_ttft_ms_p50"] - 1


def report(document: dict[str, Any]) -> str:
    """Medians per setting and concurrency, and how often one setting beat the other in the same repeat."""
    runs = document["runs"]
    lines = [
        provenance.measured_where(document),
        "",
        "| model | concurrency | setting | runs | TTFT error p50 vs server stamps / responses per s (median) | per repeat |",
        "|---|---:|---|---:|---:|---|",
    ]
    for model, metric, concurrencies in (("ensemble", "ttft", TIMING_CONCURRENCY), ("flood", "rps", FLOOD_CONCURRENCY)):
        for concurrency in concurrencies:
            for setting in SETTINGS:
                rows = [r for r in runs if r["model"] == model and r["concurrency"] == concurrency and r["setting"] == setting]
                raw = [_ttft_error(r) if metric == "ttft" else r.get("responses_per_s") for r in rows]
                values: list[float] = [float(v) for v in raw if v is not None]
                if not values:
                    continue
                fmt = (lambda v: f"{v * 100:+.2f}%") if metric == "ttft" else (lambda v: f"{v:,.0f}")
                lines.append(
                    f"| {model} | {concurrency} | {setting} | {len(values)} | {fmt(statistics.median(values))} | "
                    + ", ".join(fmt(v) for v in values)
                    + " |"
                )
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--note", default=None)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    document = run(args.repeats)
    if args.note:
        document["note"] = args.note
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
    print(report(document))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
