"""The summary layouts GenAI-Perf and AIPerf share, read into our summary schema: an aggregate JSON (per metric a
block of statistics: AIPerf's older `{"records": {tag: {...}}}` or the flat newer one, GenAI-Perf's flat one) and a
CSV (a per-metric statistics table, a blank line, then `Metric,Value` rows; numbers may carry quoted thousands
separators).

Metric mapping: GenAI-Perf's and AIPerf's `inter_token_latency` is a per-request decode average (our TPOT);
AIPerf's `inter_chunk_latency` is the pooled chunk-gap distribution (our ITL); `request_latency` is E2E.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from trtllm_forge.bench.stats import describe, scalar
from trtllm_forge.bench.tools.protocol import ExportFile

STAT_NAMES = {
    "time_to_first_token": "ttft_ms",
    "ttft": "ttft_ms",
    "time_to_second_token": "ttst_ms",
    "ttst": "ttst_ms",
    "inter_token_latency": "tpot_ms",
    "inter_chunk_latency": "itl_ms",
    "request_latency": "e2e_ms",
    "output_sequence_length": "output_tokens",
    "input_sequence_length": "input_tokens",
    "output_token_throughput_per_user": "per_user_output_tokens_per_s",
}
SYSTEM_NAMES = {
    "output_token_throughput": "output_token_throughput_per_s",
    "request_throughput": "request_throughput_per_s",
    "goodput": "goodput_per_s",
    "request_goodput": "goodput_per_s",
}
# The metrics of every imported summary; one of them must have a value.
SUMMARY_METRICS = (
    "ttft_ms",
    "ttst_ms",
    "tpot_ms",
    "itl_ms",
    "e2e_ms",
    "output_tokens",
    "input_tokens",
    "per_user_output_tokens_per_s",
    "output_token_throughput_per_s",
    "request_throughput_per_s",
    "goodput_per_s",
)


def has_metric_names(document: dict[str, Any]) -> bool:
    return any(name in document for name in (*STAT_NAMES, *SYSTEM_NAMES))


def written_by_aiperf(export: ExportFile) -> bool:
    """Whether an export in one of the shared layouts is AIPerf's (else GenAI-Perf's): its name, AIPerf's own keys
    (`records`, per-request `metadata` + `metrics`, `aiperf_version`, `schema_version`) or its CSV header."""
    if "aiperf" in export.path.name:
        return True
    document = export.document
    if document is not None:
        return (
            isinstance(document.get("records"), dict)
            or ("metadata" in document and "metrics" in document)
            or "aiperf_version" in document
            or "schema_version" in document
        )
    return any(row[:3] == ["Metric", "avg", "sum"] for row in export.rows)


def empty_summary(source: str, path: Path) -> dict[str, Any]:
    return {
        "schema": "trtllm-forge.bench/1",
        "source": source,
        "imported_from": str(path),
        "metrics": {n: describe([], "ms") for n in SUMMARY_METRICS},
        "requests": {"sent": None, "completed": None, "failed": None},
        "load": {},
    }


def number(value: Any) -> float | None:
    """A number from a JSON value or a CSV cell ("1,234.50" with a thousands separator; "N/A" is none)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.replace(",", "").strip())
        except ValueError:
            return None
    return None


def _stats(block: dict[str, Any], unit: str) -> dict[str, Any]:
    out = describe([], unit)
    for key in ("avg", "min", "max", "std", *(f"p{p}" for p in (1, 5, 10, 25, 50, 75, 90, 95, 99))):
        value = number(block.get(key))
        if value is not None:
            out[key] = value
    given = number(block.get("count"))
    out["count"] = int(given) if given is not None else (1 if any(out[k] is not None for k in ("avg", "p50", "p99")) else 0)
    return out


def from_aggregate_json(blocks: dict[str, Any], document: dict[str, Any], source: str, path: Path) -> dict[str, Any]:
    """A summary from the metric blocks of an aggregate JSON (`document` holds its input config)."""
    summary = empty_summary(source, path)
    for name, block in blocks.items():
        if not isinstance(block, dict):
            continue
        if name in STAT_NAMES:
            summary["metrics"][STAT_NAMES[name]] = _stats(block, block.get("unit", "ms"))
        elif name in SYSTEM_NAMES:
            summary["metrics"][SYSTEM_NAMES[name]] = _stats(block, block.get("unit", "per s"))
    for key, target in (("request_count", "completed"), ("error_request_count", "failed")):
        value = number((blocks.get(key) or {}).get("avg")) if isinstance(blocks.get(key), dict) else None
        if value is not None:
            summary["requests"][target] = int(value)
    if summary["requests"]["completed"] is not None and summary["requests"]["failed"] is None:
        summary["requests"]["failed"] = 0
    summary["load"] = _load_from_config(document.get("input_config") or {})
    return summary


def _load_from_config(config: Any) -> dict[str, Any]:
    """The concurrency or rate of GenAI-Perf's (`perf_analyzer.stimulus`, flat) or AIPerf's (`loadgen`) input config."""
    if not isinstance(config, dict):
        return {}
    for section in (
        config.get("perf_analyzer", {}).get("stimulus") if isinstance(config.get("perf_analyzer"), dict) else None,
        config.get("loadgen"),
        config,
    ):
        if not isinstance(section, dict):
            continue
        if concurrency := number(section.get("concurrency")):
            return {"mode": "concurrency", "value": int(concurrency)}
        if number(section.get("request_rate")):
            return {"mode": "rate", "value": number(section["request_rate"])}
    return {}


def column_name(cell: str) -> str:
    """'Time To First Token (ms)' -> 'time_to_first_token'."""
    return re.sub(r"\s*\(.*\)\s*$", "", cell).strip().lower().replace(" ", "_")


def from_profile_csv(rows: list[list[str]], source: str, path: Path) -> dict[str, Any]:
    """GenAI-Perf's or AIPerf's CSV: a per-metric stats table, a blank line, then `Metric,Value` rows."""
    summary = empty_summary(source, path)
    header: list[str] | None = None
    for row in rows:
        if not row or not any(cell.strip() for cell in row):
            header = None
            continue
        if row[0].strip() == "Metric":
            header = [cell.strip() for cell in row]
            continue
        if header is None:
            continue
        name = column_name(row[0])
        if len(header) > 2 and name in STAT_NAMES:
            summary["metrics"][STAT_NAMES[name]] = _stats(dict(zip(header[1:], row[1:], strict=False)), _unit(row[0]))
        elif len(header) == 2 and len(row) > 1:
            value = number(row[1])
            if name in SYSTEM_NAMES:
                summary["metrics"][SYSTEM_NAMES[name]] = scalar(value, _unit(row[0]) or "per s")
            elif name == "request_count" and value is not None:
                summary["requests"]["completed"] = int(value)
            elif name == "error_request_count" and value is not None:
                summary["requests"]["failed"] = int(value)
    if summary["requests"]["completed"] is not None and summary["requests"]["failed"] is None:
        summary["requests"]["failed"] = 0
    return summary


def _unit(cell: str) -> str:
    match = re.search(r"\(([^)]*)\)\s*$", cell)
    return match.group(1) if match else "ms"
