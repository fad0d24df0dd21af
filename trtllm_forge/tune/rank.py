"""The model's view of each feasible point: `plan`'s serving model predicts TTFT, TPOT and throughput per load, the
SLO keeps the loads it would meet, and the points are tried best predicted goodput first."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from trtllm_forge.config.schema import ForgeConfig
from trtllm_forge.tune.feasibility import Checked
from trtllm_forge.tune.slo import Objective, Slo
from trtllm_forge.tune.space import Point

# AIConfigurator (`plan --predict`) simulates one configuration in seconds in its own venv: per point of a space of
# dozens that is minutes before the first trial, so the ranking uses plan's model and says so on a GPU config.
TIE_SHARE = 0.02  # predictions this close rank as equal
AIC_NOTE = "AIConfigurator not asked per point (seconds each in its own venv); `trtllm-forge plan CONFIG --predict` asks it for one"


@dataclass(frozen=True)
class Predicted:
    goodput: float  # tokens/s or requests/s of every instance, at the best load meeting the SLO; 0 when none does
    concurrency: int | None  # that load
    ttft_ms: float | None
    tpot_ms: float | None
    output_tokens_per_s: float | None  # all instances, at that load (or the highest load when none meets the SLO)
    limited_by: str
    source: str  # "serving model", or "none" with the reason in limited_by

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Ranked:
    checked: Checked
    predicted: Predicted

    @property
    def config(self) -> ForgeConfig:
        assert self.checked.config is not None  # only feasible points are ranked
        return self.checked.config


def serving_instances(config: ForgeConfig) -> int:
    """Engines serving at once, as plan's serving model counts them (the server kind says)."""
    from trtllm_forge.plan.planner import make_plan
    from trtllm_forge.plan.serving_model import config_instances

    return config_instances(make_plan(config))[0]


def _meets(slo: Slo, ttft_ms: float, tpot_ms: float, output_len: float) -> bool:
    """The model predicts typical times, not tails: every goal is compared with them, whatever its statistic."""
    predicted = {"ttft": ttft_ms, "tpot": tpot_ms, "itl": tpot_ms, "e2e": ttft_ms + tpot_ms * max(0.0, output_len - 1)}
    return all(predicted[goal.metric] <= goal.limit_ms for goal in slo.goals)


def arrivals(config: ForgeConfig) -> str:
    """How the serving model sees the trial's requests: "waves" when the bench's workload has one prompt length and
    one output length (a trial's bench forces the output length, and its clients start together), else "spread"."""
    if not config.bench.workloads:
        return "spread"
    from trtllm_forge.bench.options import from_workload

    workload = config.bench.workloads[0]
    values = from_workload(workload, f"bench.workloads[{workload.name}]")
    fixed = all(spec.std == 0 and spec.low is None for spec in (values["input_len"], values["output_len"]))
    return "waves" if fixed and values.get("dataset") is None else "spread"


def predict(config: ForgeConfig, slo: Slo, concurrencies: list[int], objective: Objective) -> Predicted:
    from trtllm_forge.plan.planner import default_workload, make_plan
    from trtllm_forge.plan.serving_model import config_instances, predict_serving

    workload = default_workload(config)
    plan = make_plan(config, workload)
    instances = config_instances(plan)[0]
    pattern = arrivals(config)
    best: Predicted | None = None
    last: Predicted | None = None
    for concurrency in sorted(concurrencies):
        serving = predict_serving(plan, concurrency=concurrency, instances=instances, arrivals=pattern)
        if serving is None:
            return Predicted(0.0, None, None, None, None, "no device numbers (`plan --measure-host`)", "none")
        rate = (serving.requests_per_s if objective == "requests" else serving.output_tokens_per_s) * instances  # both per instance
        good = rate if _meets(slo, serving.ttft_ms, serving.tpot_ms, workload.output_len) else 0.0
        shown = Predicted(
            good,
            concurrency,
            serving.ttft_ms,
            serving.tpot_ms,
            serving.output_tokens_per_s * instances,
            serving.limited_by,
            "serving model",
        )
        last = shown
        if good > 0 and (best is None or good > best.goodput):
            best = shown
    if best is not None:
        return best
    if last is None:
        return Predicted(0.0, None, None, None, None, "no load to predict", "none")
    return Predicted(0.0, last.concurrency, last.ttft_ms, last.tpot_ms, last.output_tokens_per_s, last.limited_by, last.source)


def rank(feasible: list[Checked], slo: Slo, concurrencies: list[int], objective: Objective, default: Point) -> list[Ranked]:
    """Feasible points, best predicted goodput first. Predictions within TIE_SHARE of each other are a tie (knobs the
    model does not see, such as pre/post-processing instances, predict alike); a tie goes to the point that changes
    fewer knobs from the config's own values, then to the space's order."""
    ranked = [Ranked(checked, predict(checked.config, slo, concurrencies, objective)) for checked in feasible if checked.config]

    def key(item: tuple[int, Ranked]) -> tuple[float, int, int]:
        index, r = item
        bucket = math.floor(math.log(r.predicted.goodput) / math.log1p(TIE_SHARE)) if r.predicted.goodput > 0 else -(10**9)
        changed = sum(1 for name, value in r.checked.point.items() if default.get(name) != value)
        return (-bucket, changed, index)

    return [r for _, r in sorted(enumerate(ranked), key=key)]


def aiconfigurator_prediction(config: ForgeConfig) -> dict[str, Any]:
    """AIConfigurator's simulation of this point (at engine.max_batch_size, the plan's workload), as plan.json's
    `prediction`; status unsupported/unavailable with the reason when it cannot simulate it."""
    from trtllm_forge.plan.aiconfigurator import predict as simulate
    from trtllm_forge.plan.planner import default_workload, make_plan

    return simulate(make_plan(config, default_workload(config))).to_dict()
