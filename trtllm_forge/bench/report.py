"""Outputs of one sweep point: summary.json, requests.jsonl, a CSV in GenAI-Perf's layout, a console table."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from rich.table import Table

from trtllm_forge.atomic_files import write_text_atomic
from trtllm_forge.bench.records import RequestRecord, write_jsonl
from trtllm_forge.ui import console

CSV_STATS = ("avg", "min", "max", "p99", "p95", "p90", "p75", "p50", "p25", "p10", "p5", "p1")
TABLE_METRICS = ("ttft_ms", "ttst_ms", "tpot_ms", "itl_ms", "e2e_ms", "e2e_from_intended_ms", "output_tokens", "dispatch_lag_ms")
SYSTEM_METRICS = (
    "request_throughput_per_s",
    "output_token_throughput_per_s",
    "steady_request_throughput_per_s",
    "steady_output_token_throughput_per_s",
    "goodput_per_s",
    "achieved_concurrency",
)


def write_point(out: Path, summary: dict, records: list[RequestRecord]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    buffer = io.StringIO()
    write_jsonl(records, buffer)
    write_text_atomic(out / "requests.jsonl", buffer.getvalue())
    write_text_atomic(out / "summary.csv", to_csv(summary))
    write_text_atomic(out / "summary.json", json.dumps(summary, indent=2, sort_keys=True, default=str) + "\n")


def to_csv(summary: dict) -> str:
    """GenAI-Perf's profile_export_genai_perf.csv layout: request metrics, a blank line, system metrics."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["Metric", *CSV_STATS])
    for name, stats in summary["metrics"].items():
        if name in SYSTEM_METRICS or stats.get("count", 0) == 0:
            continue
        writer.writerow([name, *(_fmt(stats.get(k)) for k in CSV_STATS)])
    writer.writerow([])
    writer.writerow(["Metric", "Value"])
    for name in SYSTEM_METRICS:
        writer.writerow([name, _fmt(summary["metrics"][name]["avg"])])
    writer.writerow(["completed_requests", summary["requests"]["completed"]])
    writer.writerow(["failed_requests", summary["requests"]["failed"]])
    return buffer.getvalue()


def _fmt(value: float | None) -> str:
    return "" if value is None else f"{value:.4f}"


def _num(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def print_point(summary: dict, title: str) -> None:
    table = Table(title=title, title_justify="left")
    table.add_column("metric")
    for stat in ("avg", "min", "p50", "p90", "p99", "max", "std"):
        table.add_column(stat, justify="right")
    for name in TABLE_METRICS:
        stats = summary["metrics"][name]
        if stats["count"]:
            table.add_row(name, *(_num(stats[s]) for s in ("avg", "min", "p50", "p90", "p99", "max", "std")))
    console.print(table)
    m, req = summary["metrics"], summary["requests"]
    console.print(
        f"requests: {req['completed']} completed, {req['failed']} failed"
        + (f" ({', '.join(f'{k}: {v}' for k, v in req['errors_by_kind'].items())})" if req["failed"] else "")
        + f"; throughput {_num(m['request_throughput_per_s']['avg'])} req/s, {_num(m['output_token_throughput_per_s']['avg'], 1)} tok/s"
        + f" over {_num(summary['windows']['benchmark']['seconds'])} s (first send -> last token)"
        + (
            f"; steady {_num(m['steady_output_token_throughput_per_s']['avg'], 1)} tok/s"
            if m["steady_output_token_throughput_per_s"]["avg"]
            else ""
        )
        + f"; achieved concurrency {_num(m['achieved_concurrency']['avg'])}"
        + (f"; goodput {_num(m['goodput_per_s']['avg'])} req/s" if m["goodput_per_s"]["avg"] is not None else "")
    )
    checks = summary["self_checks"]
    console.print(
        f"self-checks: late (>1 ms) {checks['late_share']:.2%}, client CPU {_num((checks['client_cpu_busy_share'] or 0) * 100, 0)}% of a core, "
        f"event-loop lag p99 {_num(m['event_loop_lag_ms']['p99'])} ms, zero gaps {checks['zero_gap_share']:.2%}, "
        f"empty responses {checks['empty_responses']}, output-length mismatches {checks['osl_mismatch_count']}"
        + (f", hypervisor steal {checks['steal_share']:.1%}" if checks.get("steal_share") is not None else "")
    )
    if m["client_minus_server_ttft_ms"]["count"]:
        console.print(
            f"client vs server TTFT (return_perf_metrics): server TTFT p50 {_num(m['server_ttft_ms']['p50'])} ms, "
            f"client − server p50 {_num(m['client_minus_server_ttft_ms']['p50'])} ms, p99 {_num(m['client_minus_server_ttft_ms']['p99'])} ms"
        )
    for warning in summary["warnings"]:
        console.print(f"[yellow]warning:[/yellow] {warning}")


def print_sweep(points: list[dict]) -> None:
    if len(points) < 2:
        return
    table = Table(title="sweep", title_justify="left")
    for col in ("load", "req/s", "tok/s", "TTFT p50", "TTFT p99", "TPOT p50", "ITL p50", "E2E p50", "failed"):
        table.add_column(col, justify="right")
    for s in points:
        m = s["metrics"]
        load = s["load"]
        label = f"c={int(load['value'])}" if load["mode"] == "concurrency" else f"rate={load['value']:g}"
        table.add_row(
            label,
            _num(m["request_throughput_per_s"]["avg"]),
            _num(m["output_token_throughput_per_s"]["avg"], 1),
            _num(m["ttft_ms"]["p50"]),
            _num(m["ttft_ms"]["p99"]),
            _num(m["tpot_ms"]["p50"]),
            _num(m["itl_ms"]["p50"]),
            _num(m["e2e_ms"]["p50"]),
            str(s["requests"]["failed"]),
        )
    console.print(table)
