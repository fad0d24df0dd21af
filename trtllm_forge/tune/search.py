"""Successive halving over the ranked points: the model's best few get a short bench, the better half of them by
measured goodput a bench twice as long, and so on until one is left (or the budget ends). Pure logic over a
`measure` callable, so it runs the same on live trials and on recorded ones."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")
ETA = 2  # each rung keeps 1/ETA of its candidates and benches them ETA times longer


@dataclass(frozen=True)
class Rung:
    index: int
    candidates: int  # points benched at this rung
    num_requests: int  # requests per load point


def rungs(feasible: int, budget: int, base_requests: int, eta: int = ETA) -> list[Rung]:
    """The rungs of a search over `feasible` ranked points within `budget` trials: as many first-rung candidates
    as the budget allows (n + n/eta + ... + 1 <= budget), never more than the feasible points."""
    if feasible < 1 or budget < 1:
        return []

    def sizes(first: int) -> list[int]:
        out = [first]
        while out[-1] > 1:
            out.append(math.ceil(out[-1] / eta))
        return out

    first = 1
    while first < feasible and sum(sizes(first + 1)) <= budget:
        first += 1
    return [Rung(i, n, base_requests * eta**i) for i, n in enumerate(sizes(first))]


@dataclass
class Outcome(Generic[T]):
    best: T | None  # the best at the highest rung that measured something
    best_goodput: float
    trials: int  # measurements made (cached ones included)
    stopped: str | None  # why the search ended early: the budget of minutes
    rungs: list[list[tuple[T, float | None]]] = field(default_factory=list)  # per rung, (candidate, goodput or None=failed)


def successive_halving(
    ranked: Sequence[T],
    plan: list[Rung],
    measure: Callable[[T, Rung], float | None],
    deadline: float | None = None,
    clock: Callable[[], float] = time.monotonic,
    eta: int = ETA,
) -> Outcome[T]:
    """Bench `plan[0].candidates` of `ranked` (best first) at rung 0, keep the best 1/eta by measured goodput (a
    failed trial, None, never survives), and so on. `deadline` (clock time) ends the search before a trial would
    start past it."""
    outcome: Outcome[T] = Outcome(None, 0.0, 0, None)
    candidates = list(ranked[: plan[0].candidates]) if plan else []
    for rung in plan:
        measured: list[tuple[T, float | None]] = []
        for candidate in candidates:
            if deadline is not None and clock() >= deadline:
                outcome.stopped = "the --minutes budget ran out"
                break
            measured.append((candidate, measure(candidate, rung)))
            outcome.trials += 1
        outcome.rungs.append(measured)
        good = sorted(((c, g) for c, g in measured if g is not None), key=lambda item: -item[1])
        if good:
            outcome.best, outcome.best_goodput = good[0]
        if outcome.stopped or len(good) <= 1:
            break
        candidates = [c for c, _ in good[: max(1, math.ceil(len(candidates) / eta))]]
    return outcome
