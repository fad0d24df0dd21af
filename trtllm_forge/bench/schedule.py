"""Arrival schedules for open-loop load: absolute send offsets, precomputed from one seeded RNG."""

from __future__ import annotations

import numpy as np

ARRIVALS = ("constant", "poisson", "gamma")


def arrival_offsets(n: int, rate: float, arrival: str, rng: np.random.Generator, burstiness: float = 1.0) -> list[float]:
    """Seconds from the start at which each of `n` requests is due.

    poisson: exponential gaps with mean 1/rate. gamma: gaps with shape `burstiness` and scale
    1/(rate*burstiness) (burstiness 1 is Poisson; below 1 burstier, above 1 smoother). The offsets are
    cumulative, so a late send never shifts the later ones.
    """
    if n <= 0:
        return []
    if arrival == "constant":
        gaps = np.full(n, 1.0 / rate)
    elif arrival == "poisson":
        gaps = rng.exponential(1.0 / rate, n)
    elif arrival == "gamma":
        gaps = rng.gamma(burstiness, 1.0 / (rate * burstiness), n)
    else:
        raise ValueError(f"unknown arrival {arrival!r}")
    gaps[0] = 0.0  # the first request goes out at once
    return np.cumsum(gaps).tolist()
