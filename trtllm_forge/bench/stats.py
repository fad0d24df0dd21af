"""Summary statistics. Percentiles use linear interpolation between closest ranks (numpy's default, as in
GenAI-Perf, AIPerf and vLLM); std is the population standard deviation."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

PERCENTILES = (1, 5, 10, 25, 50, 75, 90, 95, 99)


def describe(values: Iterable[float], unit: str) -> dict:
    """`{unit, count, avg, min, max, std, p1 ... p99}`; statistics are None when there are no values."""
    data = np.asarray(list(values), dtype=np.float64)
    out: dict = {"unit": unit, "count": int(data.size)}
    if data.size == 0:
        out.update({k: None for k in ("avg", "min", "max", "std")})
        out.update({f"p{p}": None for p in PERCENTILES})
        return out
    out.update(avg=float(data.mean()), min=float(data.min()), max=float(data.max()), std=float(data.std()))
    for p, v in zip(PERCENTILES, np.percentile(data, PERCENTILES), strict=False):
        out[f"p{p}"] = float(v)
    return out


def scalar(value: float | None, unit: str) -> dict:
    """A single-valued metric in the same shape as `describe` (every statistic equals the value)."""
    out = describe([] if value is None else [value], unit)
    return out
