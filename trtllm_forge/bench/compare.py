"""`bench compare`: several runs side by side (a table, compare.json/csv, and a Pareto plot of output
throughput against TTFT and per-user speed). A run is a directory holding our summary.json or sweep.json,
or a perf_analyzer / GenAI-Perf / AIPerf export (see exports)."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from rich.table import Table

from trtllm_forge.errors import ConfigError
from trtllm_forge.ui import console

COLUMNS = (
    "ttft_ms_p50",
    "ttft_ms_p99",
    "tpot_ms_p50",
    "itl_ms_p50",
    "e2e_ms_p50",
    "request_throughput_per_s",
    "output_token_throughput_per_s",
    "failed",
)


def load_points(run_dir: Path) -> list[dict]:
    """The summaries in a run directory (one per sweep point)."""
    if (run_dir / "sweep.json").is_file():
        return json.loads((run_dir / "sweep.json").read_text())["points"]
    if (run_dir / "summary.json").is_file():
        return [json.loads((run_dir / "summary.json").read_text())]
    from trtllm_forge.bench.exports import UnknownExport, import_export

    try:
        return [point.summary for point in import_export(run_dir)]
    except UnknownExport:
        raise ConfigError(
            "RUN_DIR",
            f"{run_dir} holds no summary.json, sweep.json or known export",
            "give directories written by `trtllm-forge bench`, `bench import` or perf_analyzer/GenAI-Perf/AIPerf exports",
        ) from None


def _row(run_dir: Path, point: dict) -> dict:
    m = point["metrics"]

    def get(name: str, stat: str) -> float | None:
        return (m.get(name) or {}).get(stat)

    load = point.get("load") or {}
    label = {"concurrency": "c={}", "rate": "rate={}"}.get(str(load.get("mode")), "{}").format(load.get("value", "?"))
    return {
        "run": str(run_dir),
        "load": label,
        "source": point.get("source", "trtllm-forge"),
        "ttft_ms_p50": get("ttft_ms", "p50"),
        "ttft_ms_p99": get("ttft_ms", "p99"),
        "tpot_ms_p50": get("tpot_ms", "p50"),
        "itl_ms_p50": get("itl_ms", "p50"),
        "e2e_ms_p50": get("e2e_ms", "p50"),
        "request_throughput_per_s": get("request_throughput_per_s", "avg"),
        "output_token_throughput_per_s": get("output_token_throughput_per_s", "avg"),
        "per_user_tokens_per_s_p50": get("per_user_output_tokens_per_s", "p50"),
        "failed": (point.get("requests") or {}).get("failed"),
    }


def compare_runs(run_dirs: list[Path], out: Path | None) -> dict:
    rows = [_row(d, p) for d in run_dirs for p in load_points(d)]
    table = Table(title="bench compare", title_justify="left")
    table.add_column("run")
    table.add_column("source")
    table.add_column("load")
    for col in COLUMNS:
        table.add_column(col.replace("_per_s", "/s").replace("_", " "), justify="right")
    for row in rows:
        table.add_row(
            Path(row["run"]).name,
            row["source"],
            row["load"],
            *("-" if row[c] is None else f"{row[c]:,.2f}" if isinstance(row[c], float) else str(row[c]) for c in COLUMNS),
        )
    console.print(table)
    document: dict[str, Any] = {"schema": "trtllm-forge.bench-compare/1", "runs": rows}
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "compare.json").write_text(json.dumps(document, indent=2) + "\n")
        with open(out / "compare.csv", "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        document["plot"] = pareto_plot(rows, out / "pareto.png")
    return document


def pareto_plot(rows: list[dict], path: Path) -> str | None:
    """Output throughput against TTFT p50 and against per-user tokens/s, one line per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    runs: dict[str, list[dict]] = {}
    for row in rows:
        runs.setdefault(row["run"], []).append(row)
    for run, points in runs.items():
        pts = [p for p in points if p["output_token_throughput_per_s"] and p["ttft_ms_p50"]]
        pts.sort(key=lambda p: p["output_token_throughput_per_s"])
        name = Path(run).name
        axes[0].plot([p["ttft_ms_p50"] for p in pts], [p["output_token_throughput_per_s"] for p in pts], "o-", label=name)
        user = [p for p in pts if p["per_user_tokens_per_s_p50"]]
        axes[1].plot([p["per_user_tokens_per_s_p50"] for p in user], [p["output_token_throughput_per_s"] for p in user], "o-", label=name)
    axes[0].set_xlabel("TTFT p50 (ms)")
    axes[1].set_xlabel("per-user output tokens/s (p50)")
    for ax in axes:
        ax.set_ylabel("output tokens/s")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)
