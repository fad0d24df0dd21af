"""Which points of the space can run at all, before any trial: the trial's config must pass the config's own checks
(`config/checks.py`, NVIDIA's lint on GPU), fit in memory (`plan`) and be what the engine really serves."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from trtllm_forge.config.schema import ForgeConfig
from trtllm_forge.errors import ConfigError, ConfigErrors
from trtllm_forge.tune.space import Point, describe_point


@dataclass
class Checked:
    point: Point
    config: ForgeConfig | None  # the trial's config; None when it does not validate
    reasons: list[str] = field(default_factory=list)  # why it cannot run (empty: feasible)

    @property
    def feasible(self) -> bool:
        return not self.reasons


def apply_point(config: ForgeConfig, point: Mapping[str, object]) -> ForgeConfig:
    """The config with the point's knob values (or any other dotted config paths) set, validated exactly as `load_config` validates a file (schema and
    cross-field checks); ConfigErrors naming each problem when it does not validate."""
    from trtllm_forge.config.load import parse_config

    data = with_point(config.model_dump(mode="json"), point)
    trial = parse_config(data, config_dir=config.config_dir, name=config.name)
    trial.config_file = config.config_file
    return trial


def with_point(data: dict[str, Any], point: Mapping[str, object]) -> dict[str, Any]:
    """A copy of a config mapping with each dotted knob path set (a missing section is made)."""
    import copy

    data = copy.deepcopy(data)
    for name, value in point.items():
        node = data
        *parents, leaf = name.split(".")
        for part in parents:
            child = node.get(part)
            if not isinstance(child, dict):
                child = node[part] = {}
            node = child
        node[leaf] = value
    return data


def check_point(config: ForgeConfig, point: Point) -> Checked:
    try:
        trial = apply_point(config, point)
    except ConfigErrors as exc:
        return Checked(point, None, [f"{e.where}: {e.problem}" for e in exc.errors])
    except ConfigError as exc:
        return Checked(point, None, [f"{exc.where}: {exc.problem}"])
    return Checked(point, trial, _memory(trial) + _engine_limits(trial))


def _memory(trial: ForgeConfig) -> list[str]:
    from trtllm_forge.plan.advise import refusal
    from trtllm_forge.plan.planner import make_plan

    try:
        plan = make_plan(trial)
    except ConfigError as exc:
        return [f"{exc.where}: {exc.problem}"]
    if plan.fits:
        return []
    where, problem, _ = refusal(plan)
    return [f"memory: {where}: {problem}"]


def _engine_limits(trial: ForgeConfig) -> list[str]:
    """Points the engine would serve as another point: a CPU engine raises a step's token budget below the longest
    prompt to max_input_len unless prompts are split (genai_settings.scheduler_config), so such a point repeats one."""
    eng = trial.engine
    if eng.on_cpu and not trial.runtime.enable_chunked_context and eng.resolved_max_num_tokens < eng.max_input_len:
        return [
            f"engine.max_num_tokens: {eng.resolved_max_num_tokens} is below engine.max_input_len ({eng.max_input_len}); "
            "the CPU engine raises it to max_input_len, so this point repeats that one"
        ]
    return []


def check_space(config: ForgeConfig, points: list[Point]) -> tuple[list[Checked], list[Checked]]:
    """(feasible, pruned), each in the space's order."""
    checked = [check_point(config, point) for point in points]
    return [c for c in checked if c.feasible], [c for c in checked if not c.feasible]


def nearest_refusal(config: ForgeConfig, pruned: list[Checked], default: Point) -> ConfigError:
    """The error for a space without a feasible point: the pruned point closest to the config's own values (fewest
    knobs changed, then fewest reasons) and what rules it out."""

    def distance(checked: Checked) -> tuple[int, int, float]:
        changed = [(value, default.get(name)) for name, value in checked.point.items() if default.get(name) != value]
        return len(changed), len(checked.reasons), sum(_gap(value, own) for value, own in changed)

    if not pruned:
        return ConfigError("--space", "has no points", "give every knob at least one value")
    nearest = min(pruned, key=distance)
    changed = describe_point({name: value for name, value in nearest.point.items() if default.get(name) != value})
    return ConfigError(
        "--space",
        f"no feasible point among {len(pruned)}; the nearest (the config with {changed or 'its own values'}) is ruled out by "
        + "; ".join(nearest.reasons[:2]),
        "widen the space (a --space file) or change the config so that point fits",
    )


def _gap(value: object, own: object) -> float:
    """How far a numeric knob value is from the config's own (ratio, on a log scale); 1 for anything else."""
    if isinstance(value, int | float) and isinstance(own, int | float) and not isinstance(value, bool) and value > 0 and own > 0:
        return abs(math.log(value / own))
    return 1.0
