"""`bench import` and `bench compare`: other load generators' export files read into our summary schema, and the
point files written for them.

A file is recognised by its content (not its name): each tool of `tools/registry.py` is asked in turn
(`BenchTool.read_export`; the formats are listed in each tool's module). A directory given instead of a file is
searched for the tools' export files (`BenchTool.export_files`): the first tool whose file is there, passing over
a tool another found tool runs itself (GenAI-Perf's artifact folder holds perf_analyzer's export too).

Timing from per-response stamps (perf_analyzer's raw export) is ours (`metrics.summarize`): TTFT, TTST, E2E, TPOT
and ITL follow GenAI-Perf's definitions (TTFT = first response − request, E2E = last response − request,
per-request decode average = (E2E − TTFT) / (OSL − first-response tokens)), with one choice stated: responses
carrying no token (PA's null final response, an OpenAI role-only or `[DONE]` chunk) are counted but are never
timing points, as on GenAI-Perf's OpenAI path and in AIPerf.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trtllm_forge.atomic_files import write_json_atomic
from trtllm_forge.bench.records import RequestRecord
from trtllm_forge.bench.tools.aggregate_exports import SUMMARY_METRICS
from trtllm_forge.bench.tools.protocol import ExportFile, ExportProblem, ImportedPoint
from trtllm_forge.bench.tools.registry import TOOLS
from trtllm_forge.errors import ConfigError
from trtllm_forge.ui import warn

KNOWN_FORMATS = tuple(form for tool in TOOLS for form in tool.export_formats)


class UnknownExport(ConfigError):
    def __init__(self, path: Path, why: str):
        super().__init__(str(path), why, "known formats: " + "; ".join(KNOWN_FORMATS))


def import_export(path: Path, tokenizer: Any = None) -> list[ImportedPoint]:
    """The sweep points of one export file (or of the export found inside a directory).

    Raises UnknownExport (exit 2, one line naming the file and the known formats) for anything else,
    including a known layout that yields no metric."""
    path = Path(path)
    if path.is_dir():
        return import_export(_export_in(path), tokenizer)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise UnknownExport(path, f"cannot be read as text ({type(exc).__name__})") from None
    points = _read(ExportFile(path, text), tokenizer)
    for point in points:
        if not any((point.summary["metrics"].get(n) or {}).get("count") for n in SUMMARY_METRICS):
            raise UnknownExport(path, "has a known layout but no metric value in it")
    return points


def _export_in(folder: Path) -> Path:
    found: dict[str, Path] = {}
    for tool in TOOLS:
        first = next((matches[0] for name in tool.export_files if (matches := sorted(folder.rglob(name)))), None)
        if first is not None:
            found[tool.name] = first
    run_by_another = {name for tool in TOOLS if tool.name in found for name in tool.runs}
    for name, export in found.items():
        if name not in run_by_another:
            return export
    names = [name for tool in TOOLS for name in tool.export_files]
    raise UnknownExport(folder, "holds no known export file (" + ", ".join(names) + ")")


def _read(export: ExportFile, tokenizer: Any) -> list[ImportedPoint]:
    if not export.text.strip():
        raise UnknownExport(export.path, "is empty")
    for tool in TOOLS:
        try:
            points = tool.read_export(export, tokenizer)
        except ExportProblem as problem:
            raise UnknownExport(export.path, str(problem)) from None
        if points is not None:
            return points
    if not export.json_like:
        raise UnknownExport(export.path, "is neither JSON, JSONL nor a CSV with a Metric or Config Name header")
    if export.document is None:
        raise UnknownExport(export.path, "is not valid JSON")
    raise UnknownExport(export.path, "is JSON without experiments, records or known metric names")


def write_point(point_dir: Path, summary: dict[str, Any], records: list[RequestRecord] | None) -> None:
    """Our point files for an imported run: the full set when the export had per-request records."""
    from trtllm_forge.bench import report

    if records is not None and "self_checks" in summary:
        report.write_point(point_dir, summary, records)
        return
    write_json_atomic(point_dir / "summary.json", summary)


def print_imported(summary: dict[str, Any], title: str) -> None:
    from rich.table import Table

    from trtllm_forge.bench import report
    from trtllm_forge.ui import console

    if "self_checks" in summary:
        report.print_point(summary, title)
        return
    table = Table(title=title, title_justify="left")
    for column in ("metric", "avg", "p50", "p90", "p99"):
        table.add_column(column, justify="right" if column != "metric" else "left")
    for name, stats in summary["metrics"].items():
        if stats.get("count"):
            table.add_row(name, *("-" if stats.get(s) is None else f"{stats[s]:,.2f}" for s in ("avg", "p50", "p90", "p99")))
    console.print(table)
    for message in summary.get("warnings") or []:
        warn(message)
