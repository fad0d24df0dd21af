"""The latency goals of `tune --slo` (`ttft_p99_ms=500,tpot_p50_ms=50`) and the goodput they define."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Literal

from trtllm_forge.errors import ConfigError

METRICS = ("ttft", "tpot", "e2e", "itl")
STATISTICS = ("p50", "p90", "p95", "p99", "avg", "max")  # the bench summary's (bench/stats.py describe)
# The per-request limits the bench counts goodput with (bench/options.py SLO_KINDS): itl has none.
PER_REQUEST = ("ttft", "tpot", "e2e")
Objective = Literal["tokens", "requests"]
OBJECTIVES: tuple[Objective, ...] = ("tokens", "requests")
_GOAL = re.compile(r"^(?P<metric>[a-z0-9]+)_(?P<stat>[a-z0-9]+)_ms$")
EXAMPLE = "e.g. --slo ttft_p99_ms=500,tpot_p50_ms=50"


@dataclass(frozen=True)
class Goal:
    metric: str  # ttft | tpot | e2e | itl
    statistic: str  # p50 | p90 | p95 | p99 | avg | max
    limit_ms: float

    @property
    def name(self) -> str:
        return f"{self.metric}_{self.statistic}_ms"

    def measured(self, summary: dict[str, Any]) -> float | None:
        stats = (summary.get("metrics") or {}).get(f"{self.metric}_ms") or {}
        value = stats.get(self.statistic)
        return float(value) if isinstance(value, int | float) else None


@dataclass(frozen=True)
class Slo:
    goals: tuple[Goal, ...]

    def per_request_ms(self) -> dict[str, float]:
        """The bench's per-request limits (`BenchOptions.slo`): the tightest goal on each of ttft, tpot, e2e. A request
        counts towards goodput when it meets every one of them."""
        limits: dict[str, float] = {}
        for goal in self.goals:
            if goal.metric in PER_REQUEST:
                limits[goal.metric] = min(goal.limit_ms, limits.get(goal.metric, math.inf))
        return limits

    def misses(self, summary: dict[str, Any]) -> list[str]:
        """The goals one measured load point misses, as `ttft_p99_ms 812 > 500` (empty: it meets all)."""
        missed = []
        for goal in self.goals:
            value = goal.measured(summary)
            if value is None or value > goal.limit_ms:
                shown = "unmeasured" if value is None else f"{value:.4g}"
                missed.append(f"{goal.name} {shown} > {goal.limit_ms:g}")
        return missed

    def to_dict(self) -> dict[str, float]:
        return {goal.name: goal.limit_ms for goal in self.goals}

    def describe(self) -> str:
        return ",".join(f"{goal.name}={goal.limit_ms:g}" for goal in self.goals)


def parse_slo(text: str, flag: str = "--slo") -> Slo:
    """`ttft_p99_ms=500,tpot_p50_ms=50` → Slo; a part that does not parse is named in one ConfigError (exit 2)."""
    goals: list[Goal] = []
    parts = [part.strip() for part in text.split(",")]
    if not any(parts):
        raise ConfigError(flag, "empty", EXAMPLE)
    for part in parts:
        key, sep, value = part.partition("=")
        match = _GOAL.match(key.strip())
        if not sep or match is None:
            raise ConfigError(flag, f"{part!r} is not METRIC_STAT_ms=LIMIT", EXAMPLE)
        metric, stat = match["metric"], match["stat"]
        if metric not in METRICS:
            raise ConfigError(flag, f"{part!r}: unknown metric {metric!r}", f"one of {', '.join(METRICS)}")
        if stat not in STATISTICS:
            raise ConfigError(flag, f"{part!r}: unknown statistic {stat!r}", f"one of {', '.join(STATISTICS)}")
        try:
            limit = float(value)
        except ValueError:
            raise ConfigError(flag, f"{part!r}: {value.strip()!r} is not a number of milliseconds", EXAMPLE) from None
        if not math.isfinite(limit) or limit <= 0:
            raise ConfigError(flag, f"{part!r}: the limit must be a positive number of milliseconds", EXAMPLE)
        if any(g.metric == metric and g.statistic == stat for g in goals):
            raise ConfigError(flag, f"{part!r}: {key.strip()} is given twice", "give each goal once")
        goals.append(Goal(metric, stat, limit))
    return Slo(tuple(goals))


def slo_from_workload(slo_ms: dict[str, float]) -> Slo | None:
    """A workload's per-request `slo_ms` ({ttft: 500, tpot: 100}) as goals every request meets (their max)."""
    goals = tuple(Goal(metric, "max", float(limit)) for metric, limit in sorted(slo_ms.items()))
    return Slo(goals) if goals else None


def point_goodput(slo: Slo, summary: dict[str, Any], objective: Objective) -> float:
    """Goodput of one measured load point: output tokens/s (or requests/s) of the requests that met every per-request
    limit, and 0 when the point misses a goal stated as a statistic (p99 TTFT over the limit).

    Tokens: the bench's good requests/s times the mean output tokens of a request (the bench forces the output
    length, so every request of a point has about the same)."""
    if slo.misses(summary):
        return 0.0
    metrics = summary.get("metrics") or {}
    good = (metrics.get("goodput_per_s") or {}).get("avg")
    if good is None and not slo.per_request_ms():  # only statistic goals (itl): every completed request counts
        good = (metrics.get("request_throughput_per_s") or {}).get("avg")
    if not good:
        return 0.0
    if objective == "requests":
        return float(good)
    mean_tokens = (metrics.get("output_tokens") or {}).get("avg") or 0.0
    return float(good) * float(mean_tokens)
