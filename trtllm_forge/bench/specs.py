"""The two values the bench option table makes: a token length (`LengthSpec`) and one sweep point (`LoadSpec`).

On the option table's floor (below the config schema, which derives `bench.workloads[]` from bench/options.py), so
stdlib only at import: `--help` and config loading must not load numpy (LengthSpec.sample imports it when it samples).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from trtllm_forge.errors import ConfigError

if TYPE_CHECKING:
    import numpy as np


@dataclass(frozen=True, slots=True)
class LengthSpec:
    """`MEAN`, `MEAN:STD` (normal, at least 1) or `LO..HI` (uniform integers, inclusive)."""

    mean: float
    std: float = 0.0
    low: int | None = None
    high: int | None = None

    @classmethod
    def parse(cls, text: str | int, flag: str) -> LengthSpec:
        text = str(text).strip()
        try:
            if ".." in text:
                lo, hi = (int(x) for x in text.split("..", 1))
                if not 1 <= lo <= hi:
                    raise ValueError
                return cls(mean=(lo + hi) / 2, low=lo, high=hi)
            mean, _, std = text.partition(":")
            spec = cls(mean=float(mean), std=float(std or 0))
            if spec.mean < 1 or spec.std < 0:
                raise ValueError
            return spec
        except ValueError:
            raise ConfigError(flag, f"{text!r} is not a length", "use MEAN, MEAN:STD or LO..HI with lengths >= 1") from None

    def sample(self, n: int, rng: np.random.Generator) -> list[int]:
        import numpy as np

        if self.low is not None and self.high is not None:
            return rng.integers(self.low, self.high + 1, n).tolist()
        if self.std == 0:
            return [round(self.mean)] * n
        return np.maximum(1, np.round(rng.normal(self.mean, self.std, n))).astype(int).tolist()

    def describe(self) -> str:
        if self.low is not None:
            return f"{self.low}..{self.high}"
        return f"{self.mean:g}" + (f":{self.std:g}" if self.std else "")


@dataclass
class LoadSpec:
    mode: str  # "concurrency" or "rate"
    value: float  # the concurrency, or the rate in requests/s
    arrival: str = "poisson"
    burstiness: float = 1.0
    max_concurrency: int | None = None  # cap for open loop
    num_requests: int = 32
    duration_s: float | None = None
    warmup_requests: int = 0

    @property
    def label(self) -> str:
        return f"c{int(self.value)}" if self.mode == "concurrency" else f"r{self.value:g}"
