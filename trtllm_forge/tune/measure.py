"""What a trial measured, read from the bench's documents (a point's summary or a sweep): per load point its
throughput, latency and goodput under the SLO; the trial's goodput is its best point's."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from trtllm_forge.tune.slo import Objective, Slo, point_goodput


@dataclass(frozen=True)
class LoadPoint:
    load: str  # "concurrency 8", "rate 2"
    concurrency: float | None
    goodput: float
    output_tokens_per_s: float | None  # the whole deployment
    per_user_tokens_per_s: float | None  # a request's decode speed (p50)
    ttft_p99_ms: float | None
    tpot_p50_ms: float | None
    failed: int
    misses: list[str] = field(default_factory=list)


def _stat(summary: dict[str, Any], metric: str, statistic: str) -> float | None:
    value = ((summary.get("metrics") or {}).get(metric) or {}).get(statistic)
    return float(value) if isinstance(value, int | float) else None


def load_points(document: dict[str, Any], slo: Slo, objective: Objective) -> list[LoadPoint]:
    summaries = document.get("points") or [document]
    points = []
    for summary in summaries:
        load = summary.get("load") or {}
        failed = int((summary.get("requests") or {}).get("failed") or 0)
        points.append(
            LoadPoint(
                load=f"{load.get('mode', '?')} {load.get('value', '?'):g}" if isinstance(load.get("value"), int | float) else "?",
                concurrency=load.get("value") if load.get("mode") == "concurrency" else _stat(summary, "achieved_concurrency", "avg"),
                goodput=point_goodput(slo, summary, objective),
                output_tokens_per_s=_stat(summary, "output_token_throughput_per_s", "avg"),
                per_user_tokens_per_s=_stat(summary, "per_user_output_tokens_per_s", "p50"),
                ttft_p99_ms=_stat(summary, "ttft_ms", "p99"),
                tpot_p50_ms=_stat(summary, "tpot_ms", "p50"),
                failed=failed,
                misses=slo.misses(summary),
            )
        )
    return points


def best_goodput(points: list[LoadPoint]) -> float:
    return max((p.goodput for p in points), default=0.0)


def points_from_dicts(rows: list[dict[str, Any]]) -> list[LoadPoint]:
    return [LoadPoint(**row) for row in rows]
