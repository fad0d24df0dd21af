"""The answer of `tune`: the best configuration as a YAML `run` accepts, a table of every trial with the model's
prediction beside the measurement, their rank correlation, the default configuration's goodput beside the best, and
a Pareto plot (tokens/s per user against tokens/s per instance) with the SLO's frontier."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.table import Table

from trtllm_forge.tune.measure import LoadPoint
from trtllm_forge.tune.rank import Predicted
from trtllm_forge.tune.slo import Slo
from trtllm_forge.tune.space import Point, describe_point
from trtllm_forge.tune.trials import TrialResult


@dataclass
class Row:
    """One measured point of the space: its longest trial (the highest rung it reached) and the model's prediction."""

    trial: TrialResult
    predicted: Predicted | None
    instances: int
    is_default: bool = False
    aiconfigurator: dict[str, Any] | None = None  # its simulation of the point (`--aiconfigurator`), plan.json's form


def _ranks(values: list[float]) -> list[float]:
    """1-based ranks, ties given their mean rank."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(predicted: list[float], measured: list[float]) -> float | None:
    """Spearman's rank correlation (the Pearson correlation of the ranks); None with fewer than 3 pairs or a constant
    side (no ranking to compare)."""
    if len(predicted) != len(measured) or len(predicted) < 3:
        return None
    a, b = _ranks(predicted), _ranks(measured)
    mean_a, mean_b = sum(a) / len(a), sum(b) / len(b)
    cov = sum((x - mean_a) * (y - mean_b) for x, y in zip(a, b, strict=True))
    var_a = sum((x - mean_a) ** 2 for x in a)
    var_b = sum((y - mean_b) ** 2 for y in b)
    if var_a == 0 or var_b == 0:
        return None
    return cov / math.sqrt(var_a * var_b)


def model_correlation(rows: list[Row]) -> float | None:
    pairs = [(r.predicted.goodput, r.trial.goodput) for r in rows if r.predicted and r.trial.done and not r.is_default]
    return spearman([p for p, _ in pairs], [m for _, m in pairs])


def aiconfigurator_correlation(rows: list[Row]) -> float | None:
    """Spearman of AIConfigurator's simulated tokens/s with the measured goodput, over the trials it simulated."""
    pairs = [
        (float(r.aiconfigurator["values"]["tokens_per_s"]), r.trial.goodput)
        for r in rows
        if r.aiconfigurator and r.aiconfigurator.get("status") == "simulated" and r.trial.done
    ]
    return spearman([p for p, _ in pairs], [m for _, m in pairs])


def trial_table(rows: list[Row], objective_unit: str) -> Table:
    table = Table(title="tune trials (best measured first)", title_justify="left")
    for column in ("trial", "point", "requests", f"measured {objective_unit}", f"predicted {objective_unit}", "status"):
        table.add_column(column, justify="right" if column.startswith(("measured", "predicted", "requests")) else "left")
    for row in sorted(rows, key=lambda r: -r.trial.goodput):
        predicted = f"{row.predicted.goodput:.1f}" if row.predicted else "-"
        status = row.trial.status + (" (cached)" if row.trial.cached else "") + (" default" if row.is_default else "")
        if row.trial.error:
            status += f": {row.trial.error[:80]}"
        table.add_row(
            row.trial.hash[:8],
            describe_point(row.trial.point),
            str(row.trial.bench.get("num_requests", "")),
            f"{row.trial.goodput:.1f}",
            predicted,
            status,
        )
    return table


def pareto_front(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The points no other point beats on both axes, by increasing x."""
    front: list[tuple[float, float]] = []
    for x, y in sorted(points, key=lambda p: (-p[0], -p[1])):
        if not front or y > front[-1][1]:
            front.append((x, y))
    return sorted(front)


def _plotted(row: Row) -> list[tuple[float, float, LoadPoint]]:
    """(tokens/s per user, tokens/s per instance, point) of each load point of the row that measured both."""
    return [
        (p.per_user_tokens_per_s, p.output_tokens_per_s / row.instances, p)
        for p in row.trial.points
        if p.per_user_tokens_per_s is not None and p.output_tokens_per_s is not None
    ]


def plot_pareto(rows: list[Row], slo: Slo, path: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5), dpi=100)
    every: list[tuple[float, float]] = []
    meets: list[tuple[float, float]] = []
    for row in rows:
        size = 80 if row.is_default else 25
        marker = "*" if row.is_default else "o"
        for x, y, point in _plotted(row):
            good = not point.misses and point.goodput > 0
            every.append((x, y))
            if good:
                meets.append((x, y))
            ax.scatter([x], [y], marker=marker, s=size, color="tab:green" if good else "tab:red", alpha=1.0 if good else 0.5, zorder=3)
    if every:
        xs, ys = zip(*pareto_front(every), strict=True)
        ax.plot(xs, ys, "-", color="grey", linewidth=1, label="Pareto front (all trials)")
    if meets:
        xs, ys = zip(*pareto_front(meets), strict=True)
        ax.plot(xs, ys, "-", color="tab:green", linewidth=2, label="Pareto front meeting the SLO")
    tpot_goals = [g.limit_ms for g in slo.goals if g.metric in ("tpot", "itl")]
    if tpot_goals:
        ax.axvline(1000.0 / min(tpot_goals), color="tab:orange", linestyle="--", label=f"SLO frontier: TPOT {min(tpot_goals):g} ms")
    ax.scatter([], [], color="tab:green", label="load point meeting the SLO")
    ax.scatter([], [], color="tab:red", alpha=0.5, label="load point missing it")
    ax.scatter([], [], marker="*", color="black", label="default configuration")
    ax.set_xlabel("output tokens/s per user (1000 / TPOT, p50)")
    ax.set_ylabel("output tokens/s per instance")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def report_document(
    rows: list[Row], best: Row | None, default: Row | None, slo: Slo, objective: str, extra: dict[str, Any]
) -> dict[str, Any]:
    def row_dict(row: Row) -> dict[str, Any]:
        return {
            **row.trial.to_dict(),
            "cached": row.trial.cached,
            "predicted": row.predicted.to_dict() if row.predicted else None,
            "aiconfigurator": row.aiconfigurator,
        }

    gain = None
    if best and default and default.trial.goodput > 0:
        gain = best.trial.goodput / default.trial.goodput
    return {
        "schema": "trtllm-forge.tune/1",
        "slo": slo.to_dict(),
        "objective": objective,
        "best": row_dict(best) if best else None,
        "default": row_dict(default) if default else None,
        "gain_over_default": gain,
        "model_rank_correlation": model_correlation(rows),
        "aiconfigurator_rank_correlation": aiconfigurator_correlation(rows),
        "trials": [row_dict(r) for r in rows],
        **extra,
    }


def best_point_text(point: Point) -> str:
    return describe_point(point) or "(the config as it is)"
