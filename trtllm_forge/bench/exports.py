"""Read other load generators' export files into our summary schema (`bench import`, `bench compare`).

Formats, recognised by their content (not their names):

- perf_analyzer's raw profile export (`--profile-export-file`, `profile_export.json`): experiments → requests →
  per-response timestamps and outputs. Turned into our per-request records and summarised by our own
  `metrics.summarize`, so TTFT, TTST, E2E, TPOT and ITL follow GenAI-Perf's definitions on PA's timestamps
  (TTFT = first response − request, E2E = last response − request, per-request decode average =
  (E2E − TTFT) / (OSL − first-response tokens)), with one choice stated: responses carrying no token (PA's
  null final response, an OpenAI role-only or `[DONE]` chunk) are counted but are never timing points, as on
  GenAI-Perf's OpenAI path and in AIPerf. One sweep point per experiment.
- AIPerf aggregate JSON, both schemas: the older `{"records": {tag: {...}}}` (tags `ttft`, `ttst`, ...) and the
  newer flat summary (`time_to_first_token`, ..., `schema_version`); AIPerf aggregate CSV.
- AIPerf per-request JSONL (`profile_export.jsonl`), both metadata schemas (`benchmark_phase`/`request_start_ns`
  and the older `credit_phase`/`timestamp_ns`).
- GenAI-Perf `profile_export_genai_perf.json` and `.csv` (numbers may carry quoted thousands separators).
- GenAI-Perf `analyze` sweep CSV (`analyze_export_genai_perf.csv`): one point per row (p99s and averages only).

Metric mapping: GenAI-Perf's and AIPerf's `inter_token_latency` is a per-request decode average (our TPOT);
AIPerf's `inter_chunk_latency` is the pooled chunk-gap distribution (our ITL); `request_latency` is E2E.
"""

from __future__ import annotations

import csv
import json
import re
from dataclasses import dataclass
from pathlib import Path

from trtllm_forge.bench.records import RequestRecord
from trtllm_forge.bench.stats import describe, scalar
from trtllm_forge.errors import ConfigError

KNOWN_FORMATS = (
    "perf_analyzer profile_export.json",
    "AIPerf profile_export_aiperf.json/.csv (both schemas)",
    "AIPerf profile_export.jsonl",
    "GenAI-Perf profile_export_genai_perf.json/.csv",
    "GenAI-Perf analyze_export_genai_perf.csv",
)
# Looked for, in this order, inside a directory given instead of a file.
EXPORT_NAMES = (
    "profile_export_aiperf.json",
    "profile_export_genai_perf.json",
    "profile_export.jsonl",
    "profile_export_genai_perf.csv",
    "profile_export_aiperf.csv",
    "analyze_export_genai_perf.csv",
    "profile_export.json",
)

_STAT_NAMES = {
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
_SYSTEM_NAMES = {
    "output_token_throughput": "output_token_throughput_per_s",
    "request_throughput": "request_throughput_per_s",
    "goodput": "goodput_per_s",
    "request_goodput": "goodput_per_s",
}
_SUMMARY_METRICS = (
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


class UnknownExport(ConfigError):
    def __init__(self, path: Path, why: str):
        super().__init__(str(path), why, "known formats: " + "; ".join(KNOWN_FORMATS))


@dataclass
class ImportedPoint:
    summary: dict
    records: list[RequestRecord] | None = None  # per-request records, when the export has per-response timestamps


def import_export(path: Path, tokenizer=None) -> list[ImportedPoint]:
    """The sweep points of one export file (or of the first known export inside a directory).

    Raises UnknownExport (exit 2, one line naming the file and the known formats) for anything else,
    including a known layout that yields no metric."""
    path = Path(path)
    if path.is_dir():
        for name in EXPORT_NAMES:
            found = sorted(path.rglob(name))
            if found:
                return import_export(found[0], tokenizer)
        raise UnknownExport(path, "holds no known export file (" + ", ".join(EXPORT_NAMES) + ")")
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise UnknownExport(path, f"cannot be read as text ({type(exc).__name__})") from None
    points = _parse(path, text, tokenizer)
    for point in points:
        if not any((point.summary["metrics"].get(n) or {}).get("count") for n in _SUMMARY_METRICS):
            raise UnknownExport(path, "has a known layout but no metric value in it")
    return points


def _parse(path: Path, text: str, tokenizer) -> list[ImportedPoint]:
    stripped = text.lstrip()
    if not stripped:
        return _unknown(path, "is empty")
    if stripped.startswith("{"):
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            return [ImportedPoint(_from_aiperf_jsonl(path, text))] if _looks_like_jsonl(text) else _unknown(path, "is not valid JSON")
        if isinstance(data.get("experiments"), list):
            from trtllm_forge.bench.pa_export import points_from_profile_export

            return points_from_profile_export(data, path, tokenizer)
        if isinstance(data.get("records"), dict):
            return [ImportedPoint(_from_aggregate_json(data["records"], data, "aiperf", path))]
        if "metadata" in data and "metrics" in data:  # a one-line JSONL
            return [ImportedPoint(_from_aiperf_jsonl(path, text))]
        if any(name in data for name in (*_STAT_NAMES, *_SYSTEM_NAMES)):
            aiperf = "aiperf_version" in data or "schema_version" in data or "aiperf" in path.name
            return [ImportedPoint(_from_aggregate_json(data, data, "aiperf" if aiperf else "genai-perf", path))]
        return _unknown(path, "is JSON without experiments, records or known metric names")
    rows = list(csv.reader(text.splitlines()))
    first = next((row for row in rows if any(cell.strip() for cell in row)), None)
    if first and first[0].strip() == "Config Name":
        return _from_analyze_csv(rows, path)
    if first and first[0].strip() == "Metric":
        return [ImportedPoint(_from_profile_csv(rows, path))]
    return _unknown(path, "is neither JSON, JSONL nor a CSV with a Metric or Config Name header")


def _unknown(path: Path, why: str):
    raise UnknownExport(path, why)


def _looks_like_jsonl(text: str) -> bool:
    try:
        first = json.loads(text.lstrip().splitlines()[0])
    except (json.JSONDecodeError, IndexError):
        return False
    return isinstance(first, dict) and "metrics" in first


def empty_summary(source: str, path: Path) -> dict:
    return {
        "schema": "trtllm-forge.bench/1",
        "source": source,
        "imported_from": str(path),
        "metrics": {n: describe([], "ms") for n in _SUMMARY_METRICS},
        "requests": {"sent": None, "completed": None, "failed": None},
        "load": {},
    }


def _number(value) -> float | None:
    """A number from a JSON value or a CSV cell ("1,234.50" with a thousands separator; "N/A" is none)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.replace(",", "").strip())
        except ValueError:
            return None
    return None


def _stats(block: dict, unit: str) -> dict:
    out = describe([], unit)
    for key in ("avg", "min", "max", "std", *(f"p{p}" for p in (1, 5, 10, 25, 50, 75, 90, 95, 99))):
        value = _number(block.get(key))
        if value is not None:
            out[key] = value
    given = _number(block.get("count"))
    out["count"] = int(given) if given is not None else (1 if any(out[k] is not None for k in ("avg", "p50", "p99")) else 0)
    return out


def _from_aggregate_json(blocks: dict, document: dict, source: str, path: Path) -> dict:
    summary = empty_summary(source, path)
    for name, block in blocks.items():
        if not isinstance(block, dict):
            continue
        if name in _STAT_NAMES:
            summary["metrics"][_STAT_NAMES[name]] = _stats(block, block.get("unit", "ms"))
        elif name in _SYSTEM_NAMES:
            summary["metrics"][_SYSTEM_NAMES[name]] = _stats(block, block.get("unit", "per s"))
    for key, target in (("request_count", "completed"), ("error_request_count", "failed")):
        value = _number((blocks.get(key) or {}).get("avg")) if isinstance(blocks.get(key), dict) else None
        if value is not None:
            summary["requests"][target] = int(value)
    if summary["requests"]["completed"] is not None and summary["requests"]["failed"] is None:
        summary["requests"]["failed"] = 0
    summary["load"] = _load_from_config(document.get("input_config") or {})
    return summary


def _load_from_config(config: dict) -> dict:
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
        if concurrency := _number(section.get("concurrency")):
            return {"mode": "concurrency", "value": int(concurrency)}
        if _number(section.get("request_rate")):
            return {"mode": "rate", "value": _number(section["request_rate"])}
    return {}


def _name(cell: str) -> str:
    """'Time To First Token (ms)' -> 'time_to_first_token'."""
    return re.sub(r"\s*\(.*\)\s*$", "", cell).strip().lower().replace(" ", "_")


def _from_profile_csv(rows: list[list[str]], path: Path) -> dict:
    """GenAI-Perf's or AIPerf's CSV: a per-metric stats table, a blank line, then `Metric,Value` rows."""
    source = "aiperf" if "aiperf" in path.name or any(row[:3] == ["Metric", "avg", "sum"] for row in rows) else "genai-perf"
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
        name = _name(row[0])
        if len(header) > 2 and name in _STAT_NAMES:
            summary["metrics"][_STAT_NAMES[name]] = _stats(dict(zip(header[1:], row[1:], strict=False)), _unit(row[0]))
        elif len(header) == 2 and len(row) > 1:
            value = _number(row[1])
            if name in _SYSTEM_NAMES:
                summary["metrics"][_SYSTEM_NAMES[name]] = scalar(value, _unit(row[0]) or "per s")
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


_ANALYZE_COLUMNS = {  # analyze CSV column (normalised) -> (our metric, statistic)
    "p99_time_to_first_token": ("ttft_ms", "p99"),
    "p99_inter_token_latency": ("tpot_ms", "p99"),
    "p99_request_latency": ("e2e_ms", "p99"),
    "p99_output_sequence_length": ("output_tokens", "p99"),
    "p99_input_sequence_length": ("input_tokens", "p99"),
    "p99_time_to_second_token": ("ttst_ms", "p99"),
    "avg._output_token_throughput": ("output_token_throughput_per_s", "avg"),
    "request_throughput": ("request_throughput_per_s", "avg"),
}


def _from_analyze_csv(rows: list[list[str]], path: Path) -> list[ImportedPoint]:
    """`genai-perf analyze`: the first table has one run (config) per row; the GPU table after the blank line is skipped."""
    points: list[ImportedPoint] = []
    header: list[str] | None = None
    for row in rows:
        if not row or not any(cell.strip() for cell in row):
            if points:
                break
            continue
        if row[0].strip() == "Config Name":
            header = [_name(cell) for cell in row]
            continue
        if header is None:
            continue
        cells = dict(zip(header, row, strict=False))
        summary = empty_summary("genai-perf", path)
        summary["config_name"] = row[0].strip()
        for column, (metric, stat) in _ANALYZE_COLUMNS.items():
            value = _number(cells.get(column))
            if value is not None:
                summary["metrics"][metric][stat] = value
                summary["metrics"][metric]["count"] = 1
        for column, mode in (("concurrency", "concurrency"), ("request_rate", "rate")):
            value = _number(cells.get(column))
            if value is not None:
                summary["load"] = {"mode": mode, "value": int(value) if mode == "concurrency" else value}
                break
        for column, key in (("isl", "input_tokens_mean"), ("num_prompts", "num_prompts")):
            value = _number(cells.get(column))
            if value is not None:
                summary.setdefault("workload", {})[key] = value
        points.append(ImportedPoint(summary))
    return points


def _first_given(*values):
    return next((v for v in values if v is not None), None)


def _from_aiperf_jsonl(path: Path, text: str) -> dict:
    """AIPerf's per-request records: per-request values are pooled and summarised here; the window runs from
    the first request start to the last response."""
    summary = empty_summary("aiperf", path)
    values: dict[str, list[float]] = {}
    starts, ends, failed, done, out_tokens = [], [], 0, 0, 0.0
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            raise UnknownExport(path, f"line {number} is not JSON") from None
        meta = record.get("metadata") or {}
        if (meta.get("benchmark_phase") or meta.get("credit_phase") or "profiling") != "profiling":
            continue
        if record.get("error") or meta.get("error"):
            failed += 1
            continue
        done += 1
        metrics = record.get("metrics") or {}

        def value_of(tag, metrics=metrics):
            metric = metrics.get(tag)
            return metric.get("value") if isinstance(metric, dict) else metric

        start = _first_given(meta.get("request_start_ns"), value_of("min_request_timestamp"), meta.get("timestamp_ns"))
        end = _first_given(meta.get("request_end_ns"), value_of("max_response_timestamp"))
        if end is None and start is not None and value_of("request_latency") is not None:
            end = start + value_of("request_latency") * 1e6
        if start is not None:
            starts.append(start)
        if end is not None:
            ends.append(end)
        for tag in metrics:
            key, value = _STAT_NAMES.get(tag), value_of(tag)
            if key is None or value is None:
                continue
            values.setdefault(key, []).extend(value if isinstance(value, list) else [value])
            if key == "output_tokens":
                out_tokens += float(value)
    for key, vals in values.items():
        summary["metrics"][key] = describe(vals, "tokens" if key.endswith("tokens") else "ms")
    if starts and ends and max(ends) > min(starts):
        window = (max(ends) - min(starts)) / 1e9
        summary["metrics"]["request_throughput_per_s"] = scalar(done / window, "requests/s")
        summary["metrics"]["output_token_throughput_per_s"] = scalar(out_tokens / window, "tokens/s")
    summary["requests"] = {"sent": done + failed, "completed": done, "failed": failed}
    return summary
