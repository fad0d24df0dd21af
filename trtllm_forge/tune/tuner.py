"""`tune` from question to answer: the space, its feasible points, the model's ranking, the search, the report."""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trtllm_forge.atomic_files import write_json_atomic, write_text_atomic
from trtllm_forge.config.schema import ForgeConfig
from trtllm_forge.errors import ConfigError
from trtllm_forge.processes import sigterm_as_interrupt
from trtllm_forge.tune.config_file import config_yaml
from trtllm_forge.tune.feasibility import Checked, apply_point, check_space, nearest_refusal
from trtllm_forge.tune.rank import AIC_NOTE, Predicted, Ranked, predict, rank, serving_instances
from trtllm_forge.tune.report import Row, plot_pareto, report_document, trial_table
from trtllm_forge.tune.search import Outcome, Rung, rungs, successive_halving
from trtllm_forge.tune.slo import Objective, Slo
from trtllm_forge.tune.space import Knob, Point, default_point, describe_point, grid, point_key
from trtllm_forge.tune.trials import BenchPlan, TrialResult, run_trial
from trtllm_forge.ui import console, info

DEFAULT_TRIALS = 8
DEFAULT_BASE_REQUESTS = 8
SHOWN_RANKS = 20  # --dry-run prints this many of the ranking


@dataclass
class Question:
    config: ForgeConfig
    workdir: Path
    slo: Slo
    objective: Objective
    knobs: list[Knob]
    concurrencies: tuple[int, ...]
    trials: int | None = None  # --trials; None: DEFAULT_TRIALS unless --minutes is given alone
    minutes: float | None = None
    base_requests: int = DEFAULT_BASE_REQUESTS

    @property
    def budget(self) -> int:
        if self.trials is not None:
            return self.trials
        return 10_000 if self.minutes is not None else DEFAULT_TRIALS


@dataclass
class Prepared:
    question: Question
    default: Point
    feasible: list[Checked]
    pruned: list[Checked]
    ranked: list[Ranked]
    plan: list[Rung]
    notes: list[str] = field(default_factory=list)


def with_workload(config: ForgeConfig, concurrencies: tuple[int, ...] | None) -> ForgeConfig:
    """The config tune measures: its first bench workload, or (a config without one, e.g. for a GPU host) a workload
    `tune` of the plan's default lengths at `--concurrency`; refused when there is neither."""
    if config.bench.workloads:
        return config
    if not concurrencies:
        raise ConfigError(
            "bench.workloads",
            "tune measures the config's first bench workload, and there is none",
            "add one, or pass --concurrency (e.g. 1,8)",
        )
    from trtllm_forge.plan.planner import default_workload

    lengths = default_workload(config)
    return apply_point(config, {"bench.workloads": [{"name": "tune", "input_len": lengths.input_len, "output_len": lengths.output_len}]})


def workload_concurrencies(config: ForgeConfig) -> tuple[int, ...]:
    """The closed-loop loads of the config's first bench workload (with only request rates: 1 and max_batch_size)."""
    concurrency = list(getattr(config.bench.workloads[0], "concurrency", None) or []) if config.bench.workloads else []
    return tuple(sorted(set(concurrency or [1, config.engine.max_batch_size])))


def prepare(question: Question) -> Prepared:
    """Every point of the space checked, the feasible ones ranked by the model, and the rungs of the search."""
    config = question.config
    points = grid(question.knobs)
    feasible, pruned = check_space(config, points)
    default = default_point(config, question.knobs)
    if not feasible:
        raise nearest_refusal(config, pruned, default)
    notes = []
    try:
        ranked = rank(feasible, question.slo, list(question.concurrencies), question.objective, default)
    except ConfigError as exc:
        notes.append(f"no model ranking ({exc.where}: {exc.problem}); points keep the space's order")
        none = Predicted(0.0, None, None, None, None, "no model", "none")
        ranked = [Ranked(c, none) for c in feasible]
    if all(r.predicted.source == "none" for r in ranked):
        notes.append(f"the model predicted nothing ({ranked[0].predicted.limited_by}); points keep the space's order")
    if not config.engine.on_cpu:
        notes.append(AIC_NOTE)
    base = question.base_requests
    budget = max(1, question.budget - 1)  # one trial measures the config as it is
    return Prepared(question, default, feasible, pruned, ranked, rungs(len(ranked), budget, base), notes)


def trial_commands(config_path: Path, workdir: Path, bench: BenchPlan, slo: Slo) -> list[list[str]]:
    """What a trial runs, as the commands that would do the same by hand."""
    wd = str(workdir)
    slo_flags = [f"--slo={kind}:{limit:g}" for kind, limit in slo.per_request_ms().items()]
    return [
        ["trtllm-forge", "render", str(config_path), "--workdir", wd],
        ["trtllm-forge", "deploy", str(config_path), "--workdir", wd],
        [
            "trtllm-forge", "bench", str(config_path), "--workdir", wd, "--concurrency", ",".join(map(str, bench.concurrencies)),
            "--num-requests", str(bench.num_requests), *slo_flags,
        ],
        ["trtllm-forge", "deploy", "stop", "--workdir", wd],
    ]  # fmt: skip


def show_plan(prepared: Prepared) -> dict[str, Any]:
    """`--dry-run`: the feasible points, the pruned ones with their reasons, the ranking, the rungs and the commands."""
    q = prepared.question
    info(
        f"[bold]tune (dry run)[/bold] {q.config.name}: {len(prepared.feasible)} feasible of {len(prepared.feasible) + len(prepared.pruned)} points, SLO {q.slo.describe()}"
    )
    for checked in prepared.pruned:
        info(f"  pruned {describe_point(checked.point)}: {'; '.join(checked.reasons)}")
    for index, ranked in enumerate(prepared.ranked[:SHOWN_RANKS], start=1):
        p = ranked.predicted
        info(f"  {index:3}. {describe_point(ranked.checked.point)}: predicted goodput {p.goodput:.1f} ({p.source}, {p.limited_by})")
    if len(prepared.ranked) > SHOWN_RANKS:
        info(f"  ... {len(prepared.ranked) - SHOWN_RANKS} more (--json lists every one)")
    for rung in prepared.plan:
        info(f"  rung {rung.index}: {rung.candidates} trials of {rung.num_requests} requests per load")
    for note in prepared.notes:
        info(f"  note: {note}")
    bench = BenchPlan(q.concurrencies, prepared.plan[0].num_requests if prepared.plan else q.base_requests)
    commands = trial_commands(q.workdir / "tune" / "trials" / "<hash>" / "config.yaml", q.workdir, bench, q.slo)
    info("each trial runs (in one process):")
    for argv in commands:
        info(f"  {shlex.join(argv)}")
    info("dry run: nothing was run and nothing was written")
    return {
        "dry_run": True,
        "feasible": [c.point for c in prepared.feasible],
        "pruned": [{"point": c.point, "reasons": c.reasons} for c in prepared.pruned],
        "ranking": [{"point": r.checked.point, "predicted": r.predicted.to_dict()} for r in prepared.ranked],
        "rungs": [vars(r) for r in prepared.plan],
        "commands": [shlex.join(argv) for argv in commands],
        "notes": prepared.notes,
    }


def run_search(prepared: Prepared, before_trial: Callable[[], None] | None = None) -> dict[str, Any]:
    """Measure (SIGTERM and Ctrl-C stop it cleanly), then answer. `before_trial` runs before each trial (the
    benchmark script measures its grid between tune's trials with it, so both see the machine alike)."""
    with sigterm_as_interrupt():
        return _search(prepared, before_trial or (lambda: None))


def _search(prepared: Prepared, before_trial: Callable[[], None]) -> dict[str, Any]:
    """Successive halving over the ranking, then the config as it is, then the answer."""
    q = prepared.question
    deadline = time.monotonic() + q.minutes * 60 if q.minutes is not None else None
    latest: dict[str, TrialResult] = {}  # per point (its description): its trial at the highest rung it reached
    predicted: dict[str, Ranked] = {}
    shorter: list[Row] = []  # every measurement; those a longer one of the same point replaced are listed apart

    def measure(candidate: Ranked, rung: Rung) -> float | None:
        key = point_key(candidate.checked.point)
        info(
            f"[bold]trial[/bold] rung {rung.index}: {describe_point(candidate.checked.point)} (predicted {candidate.predicted.goodput:.1f})"
        )
        result = run_trial(
            candidate.config, candidate.checked.point, BenchPlan(q.concurrencies, rung.num_requests), q.slo, q.objective, q.workdir
        )
        latest[key], predicted[key] = result, candidate
        shorter.append(Row(result, candidate.predicted, serving_instances(candidate.config)))
        info(f"  {'cached ' if result.cached else ''}{result.status}: goodput {result.goodput:.1f}")
        return result.goodput if result.done else None

    outcome: Outcome[Ranked] = successive_halving(prepared.ranked, prepared.plan, measure, deadline)
    final_requests = prepared.plan[-1].num_requests if prepared.plan else q.base_requests
    default_row = None
    if outcome.stopped is None:
        before_trial()
        default_config = apply_point(q.config, {})
        result = run_trial(default_config, prepared.default, BenchPlan(q.concurrencies, final_requests), q.slo, q.objective, q.workdir)
        info(f"default configuration: {result.status}, goodput {result.goodput:.1f}")
        default_pred = predict(default_config, q.slo, list(q.concurrencies), q.objective)
        default_row = Row(result, default_pred, serving_instances(default_config), is_default=True)
    rows = [Row(latest[k], predicted[k].predicted, serving_instances(predicted[k].config)) for k in latest]
    best = None
    if outcome.best is not None:
        key = point_key(outcome.best.checked.point)
        best = next(r for r in rows if point_key(r.trial.point) == key)
    if default_row is not None and default_row.trial.goodput > (best.trial.goodput if best else 0.0):
        best = default_row  # measured as long as the last rung: the config as it is was the best seen
    kept = {id(r.trial) for r in rows}
    earlier = [r for r in shorter if id(r.trial) not in kept]
    extra = {
        "trials_used": outcome.trials + (default_row is not None),
        "stopped": outcome.stopped,
        "feasible": len(prepared.feasible),
        "pruned": len(prepared.pruned),
        "notes": prepared.notes,
        "shorter_trials": [{**r.trial.to_dict(), "predicted": r.predicted.to_dict() if r.predicted else None} for r in earlier],
    }
    every = [*rows, *([default_row] if default_row else [])]
    return answer(q.config, q.workdir, q.slo, q.objective, every, best, default_row, extra, earlier)


def answer(
    config: ForgeConfig,
    workdir: Path,
    slo: Slo,
    objective: Objective,
    rows: list[Row],
    best: Row | None,
    default: Row | None,
    extra: dict[str, Any],
    earlier: list[Row] | None = None,
) -> dict[str, Any]:
    """Write best.yaml, report.json and pareto.png under <workdir>/tune and print the table (with the `earlier`,
    shorter trials of points measured again); the report document."""
    out = workdir / "tune"
    unit = "tokens/s" if objective == "tokens" else "requests/s"
    console.print(trial_table([*rows, *(earlier or [])], unit))
    files: dict[str, str] = {}
    if best is not None and best.trial.goodput > 0:
        best_config = apply_point(config, best.trial.point)
        header = f"trtllm-forge tune: best of {len(rows)} measured points under {slo.describe()}: {describe_point(best.trial.point)}"
        write_text_atomic(out / "best.yaml", config_yaml(best_config, header))
        files["best_config"] = str(out / "best.yaml")
    files["pareto_plot"] = str(plot_pareto(rows, slo, out / "pareto.png", f"{config.name}: measured load points, SLO {slo.describe()}"))
    document = report_document(rows, best, default, slo, objective, {**extra, "files": files})
    write_json_atomic(out / "report.json", document)
    files["report"] = str(out / "report.json")
    _summary(document, unit)
    return document


def _summary(document: dict[str, Any], unit: str) -> None:
    best, default = document["best"], document["default"]
    if best and best["goodput"] > 0:
        info(f"[bold]best[/bold] {describe_point(best['point'])}: goodput {best['goodput']:.1f} {unit}")
    else:
        info("no measured point met the SLO: no best configuration written")
    if default:
        info(
            f"default configuration: goodput {default['goodput']:.1f} {unit}"
            + (f" (best is {document['gain_over_default']:.2f}x)" if document["gain_over_default"] else "")
        )
    rho = document["model_rank_correlation"]
    info(f"model vs measured rank correlation (Spearman): {'n/a (fewer than 3 comparable trials)' if rho is None else f'{rho:.2f}'}")
    info(f"trials used: {document['trials_used']}" + (f"; stopped early: {document['stopped']}" if document.get("stopped") else ""))
    for name, path in document["files"].items():
        info(f"  {name}: {path}")
