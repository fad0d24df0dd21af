#!/usr/bin/env python3
"""`tune` against a full grid (issue #34 item 7): on configs/smollm2-cpu.yaml with a short workload, every point of a
24-point space is measured (the grid), and `tune` searches the same space under the same SLO; the grid's trials run
between tune's (interleaved), so both see the machine alike.

  space   engine.max_batch_size 4/8/16 (build: the export is reused), runtime.arrival_window_ms 0/20,
          runtime.max_tokens_in_paged_kv_cache 8192/32768, triton.instances.postprocessing 1/2
  load    closed loop at concurrency 8, 64 prompt + 32 output tokens
  grid    each point benched as long as tune's last rung (the longest bench tune runs)

The goals: tune's pick measured by the grid within 5% of the grid's best goodput, with at most 30% of the grid's
trials; also the gain of tune's pick over the config as it is, and the rank correlation (Spearman) of plan's serving
model with the grid's measurements over every point.

Writes results/bench_tune/<--name, default tune>.json (git commit, machine, load, every trial). --smoke: a 2-point space and
tiny benches, written under the workdir (never into results/), to check the script runs.

    .venv/bin/python scripts/bench_tune.py [--note "..."]          # about 15-25 minutes on a 2-core machine
    .venv/bin/python scripts/bench_tune.py --smoke
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from trtllm_forge.bench.provenance import finish, record, write_result

REPO = Path(__file__).resolve().parent.parent
RESULTS_DIR = REPO / "results" / "bench_tune"
SCHEMA = "trtllm-forge.bench-tune/1"
CONFIG = REPO / "configs" / "smollm2-cpu.yaml"
SPACE = {
    "engine.max_batch_size": [4, 8, 16],
    "engine.max_num_tokens": [2048],
    "runtime.arrival_window_ms": [0, 20],
    "runtime.max_tokens_in_paged_kv_cache": [8192, 32768],
    "triton.instances.preprocessing": [1],
    "triton.instances.postprocessing": [1, 2],
}
SMOKE_SPACE = {**{name: values[:1] for name, values in SPACE.items()}, "engine.max_batch_size": [8, 16]}
SLO = "ttft_p99_ms=1000,tpot_p50_ms=100"
GOAL_SHARE = 0.95  # tune's pick within 5% of the grid's best
GOAL_TRIALS = 0.30  # with at most 30% of the grid's trials


def _config(smoke: bool) -> Any:
    """configs/smollm2-cpu.yaml with free ports and the short workload of this benchmark."""
    from trtllm_forge.config import load_config
    from trtllm_forge.config.load import parse_config

    base = load_config(CONFIG)
    data = base.model_dump(mode="json")
    data["triton"].update(http_port=0, grpc_port=0, metrics_port=0, bind_address="127.0.0.1")
    workload = {"name": "tune", "input_len": 64, "output_len": 16 if smoke else 32, "concurrency": [2 if smoke else 8]}
    data["bench"]["workloads"] = [workload]
    config = parse_config(data, config_dir=CONFIG.parent, name="smollm2-cpu")
    config.config_file = CONFIG
    return config


def _link_stages(source: Path, target: Path) -> None:
    """The import and build of `source` in `target` as if they ran there (hard links): both are skipped."""
    for stage in ("import", "build"):
        shutil.copytree(source / stage, target / stage, symlinks=True, copy_function=os.link)


CONFIRM_REPEATS = 3


def _best_point(grid_results: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    done = [r for r in grid_results.values() if r["status"] == "done"]
    return max(done, key=lambda r: r["goodput"])["point"] if done else None


def confirm_round(config: Any, named: dict[str, dict[str, Any] | None], bench: Any, slo: Any, work: Path, repeats: int) -> dict[str, Any]:
    """The grid's best, tune's pick and the config as it is benched again side by side, in rotated order, `repeats`
    times each (a fresh workdir per repeat, so no trial is read from a cache). The goals are judged on these paired
    measurements: the grid's best was picked as the largest of many noisy measurements, so its own number is biased
    high against any single other measurement."""
    from trtllm_forge.tune.feasibility import apply_point
    from trtllm_forge.tune.space import point_key
    from trtllm_forge.tune.trials import run_trial

    points: dict[str, dict[str, Any]] = {}  # one entry per distinct point: its names and its measurements
    for name, point in named.items():
        if point is None:
            continue
        entry = points.setdefault(point_key(point), {"names": [], "point": point, "goodput": []})
        entry["names"].append(name)
    keys = list(points)
    for repeat in range(repeats):
        workdir = work / "confirm" / f"r{repeat}"
        shutil.rmtree(workdir, ignore_errors=True)
        workdir.mkdir(parents=True)
        _link_stages(work / "grid", workdir)
        for key in keys[repeat % len(keys) :] + keys[: repeat % len(keys)]:
            entry = points[key]
            result = run_trial(apply_point(config, entry["point"]), entry["point"], bench, slo, "tokens", workdir)
            entry["goodput"].append(result.goodput if result.status == "done" else None)
            print(f"confirm r{repeat} {'/'.join(entry['names'])}: {result.status} {result.goodput:.1f}", file=sys.stderr)
    by_name = {name: entry for entry in points.values() for name in entry["names"]}

    def ratio(a: str, b: str) -> dict[str, Any] | None:
        if a not in by_name or b not in by_name:
            return None
        pairs = [x / y for x, y in zip(by_name[a]["goodput"], by_name[b]["goodput"], strict=True) if x is not None and y]
        return {"per_repeat": [round(r, 4) for r in pairs], "median": round(statistics.median(pairs), 4) if pairs else None}

    return {
        "repeats": repeats,
        "points": list(points.values()),
        "tune_pick_over_grid_best": ratio("tune pick", "grid best"),
        "tune_pick_over_as_is": ratio("tune pick", "as is"),
        "grid_best_over_as_is": ratio("grid best", "as is"),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    from trtllm_forge.builders.registry import build

    from trtllm_forge.importer.stage import import_checkpoint
    from trtllm_forge.pipeline import measure_host_once
    from trtllm_forge.tune.feasibility import Checked, apply_point, check_space
    from trtllm_forge.tune.report import spearman
    from trtllm_forge.tune.slo import parse_slo
    from trtllm_forge.tune.space import Knob, default_space, grid, point_key
    from trtllm_forge.tune.trials import BenchPlan, run_trial
    from trtllm_forge.tune.tuner import Question, prepare, run_search

    config = _config(args.smoke)
    space = SMOKE_SPACE if args.smoke else SPACE
    stages = {k.name: k.stage for k in default_space(config)}
    knobs = [Knob(name, tuple(values), stages.get(name, "render"), name) for name, values in space.items()]
    slo = parse_slo(SLO)
    work = args.workdir.resolve()
    shutil.rmtree(work / "grid", ignore_errors=True)
    shutil.rmtree(work / "tune", ignore_errors=True)
    (work / "grid").mkdir(parents=True)
    measure_host_once(config)
    imported = import_checkpoint(config, work / "grid")
    build(config, work / "grid", imported.checkpoint_dir)
    (work / "tune").mkdir()
    _link_stages(work / "grid", work / "tune")

    base_requests = 2 if args.smoke else 8
    trials = 2 if args.smoke else max(2, int(GOAL_TRIALS * len(grid(knobs))))
    question = Question(
        config, work / "tune", slo, "tokens", knobs, tuple(config.bench.workloads[0].concurrency), trials, None, base_requests
    )
    prepared = prepare(question)
    grid_requests = prepared.plan[-1].num_requests
    feasible, pruned = check_space(config, grid(knobs))
    # The config as it is is measured beside the grid too (not counted as a grid trial): tune may answer with it, and
    # the gain over it is read from the grid's measurements.
    as_is = Checked(prepared.default, apply_point(config, {}))
    pending = [*feasible, as_is]
    grid_results: dict[str, dict[str, Any]] = {}
    per_chunk = max(1, -(-len(pending) // (sum(r.candidates for r in prepared.plan) + 1)))

    def grid_chunk(count: int) -> None:
        for _ in range(min(count, len(pending))):
            checked = pending.pop(0)
            assert checked.config is not None
            result = run_trial(
                checked.config, checked.point, BenchPlan(question.concurrencies, grid_requests), slo, "tokens", work / "grid"
            )
            grid_results[point_key(checked.point)] = {**result.to_dict(), "point": checked.point}

    started = time.monotonic()
    tune_doc = run_search(prepared, before_trial=lambda: grid_chunk(per_chunk))
    grid_chunk(len(pending))

    confirmed = confirm_round(
        config,
        {
            "grid best": _best_point(grid_results),
            "tune pick": tune_doc["best"]["point"] if tune_doc["best"] else None,
            "as is": prepared.default,
        },
        BenchPlan(question.concurrencies, grid_requests),
        slo,
        work,
        1 if args.smoke else CONFIRM_REPEATS,
    )
    elapsed = time.monotonic() - started

    predicted = {point_key(r.checked.point): r.predicted.goodput for r in prepared.ranked}
    default_key = point_key(prepared.default)
    default_by_grid = (
        grid_results.pop(default_key, {})
        if default_key not in {point_key(c.point) for c in feasible}
        else grid_results.get(default_key, {})
    )
    keys = [k for k in grid_results if grid_results[k]["status"] == "done"]
    grid_best_key = max(keys, key=lambda k: grid_results[k]["goodput"]) if keys else None
    grid_best = grid_results[grid_best_key]["goodput"] if grid_best_key else 0.0
    tune_pick = tune_doc["best"]["point"] if tune_doc["best"] else None
    measured = {**grid_results, default_key: default_by_grid}
    pick_by_grid = measured.get(point_key(tune_pick), {}).get("goodput") if tune_pick is not None else None
    share = pick_by_grid / grid_best if (pick_by_grid is not None and grid_best) else None
    trials_share = tune_doc["trials_used"] / len(grid_results) if grid_results else None
    return {
        "schema": SCHEMA,
        "smoke": args.smoke,
        "config": str(CONFIG.relative_to(REPO)),
        "workload": config.bench.workloads[0].model_dump(mode="json"),
        "slo": slo.to_dict(),
        "space": space,
        "pruned": [{"point": c.point, "reasons": c.reasons} for c in pruned],
        "grid": {
            "points": len(grid_results),
            "requests_per_load": grid_requests,
            "trials": list(grid_results.values()),
            "default": default_by_grid,
        },
        "tune": tune_doc,
        "summary": {
            "grid_best_point": grid_results[grid_best_key]["point"] if grid_best_key else None,
            "grid_best_goodput": grid_best,
            "tune_pick": tune_pick,
            "tune_pick_goodput_by_tune": tune_doc["best"]["goodput"] if tune_doc["best"] else None,
            "tune_pick_goodput_by_grid": pick_by_grid,
            "tune_pick_share_of_grid_best": share,
            "goal_share": GOAL_SHARE,
            "meets_share_goal": share is not None and share >= GOAL_SHARE,
            "tune_trials": tune_doc["trials_used"],
            "tune_trials_share_of_grid": trials_share,
            "goal_trials_share": GOAL_TRIALS,
            "meets_trials_goal": trials_share is not None and trials_share <= GOAL_TRIALS,
            "default_goodput_by_grid": default_by_grid.get("goodput"),
            "gain_over_default_by_tune": tune_doc["gain_over_default"],
            "gain_over_default_by_grid": pick_by_grid / default_by_grid["goodput"]
            if (pick_by_grid and default_by_grid.get("goodput"))
            else None,
            "grid_best_gain_over_default": grid_best / default_by_grid["goodput"] if default_by_grid.get("goodput") else None,
            "model_rank_correlation_tune_trials": tune_doc["model_rank_correlation"],
            "model_rank_correlation_grid": spearman([predicted[k] for k in keys], [grid_results[k]["goodput"] for k in keys]),
            "seconds": round(elapsed, 1),
        },
        "confirmation": confirmed,
    }


def _ratio_text(ratio: dict[str, Any] | None) -> str:
    if not ratio or ratio.get("median") is None:
        return "-"
    return f"{ratio['median']:.2f}× (per repeat: {', '.join(f'{r:.2f}' for r in ratio['per_repeat'])})"


def render_table(document: dict[str, Any]) -> str:
    """The docs block: the grid against tune under one SLO, the side-by-side confirmation, the goals' verdicts."""
    from trtllm_forge.bench.provenance import measured_where

    summary, confirmation, workload = document["summary"], document["confirmation"], document["workload"]
    knobs = ", ".join(f"{name} {'/'.join(str(v) for v in values)}" for name, values in document["space"].items() if len(values) > 1)
    lines = [
        f"Space: {document['grid']['points']} points ({knobs}); load: concurrency {'/'.join(str(c) for c in workload['concurrency'])}, "
        f"{workload['input_len']} prompt → {workload['output_len']} output tokens, {document['grid']['requests_per_load']} requests "
        f"per grid point; SLO {', '.join(f'{k} ≤ {v}' for k, v in document['slo'].items())}; goodput = output tok/s of the "
        f"requests meeting every goal; {measured_where(document)}",
        "",
        "| configuration | point | goodput in its search (tok/s) | confirmation, median of "
        f"{confirmation['repeats']} side-by-side repeats (tok/s) |",
        "|---|---|---:|---:|",
    ]
    searched = {
        "grid best": summary["grid_best_goodput"],
        "tune pick": summary["tune_pick_goodput_by_tune"],
        "as is": summary["default_goodput_by_grid"],
    }
    for entry in confirmation["points"]:
        values = [v for v in entry["goodput"] if v is not None]
        median = f"{statistics.median(values):.1f}" if values else "-"
        point = (
            ", ".join(f"{k.rsplit('.', 1)[-1]}={'unset' if v is None else v}" for k, v in entry["point"].items()) or "the config as it is"
        )
        found = [searched[name] for name in entry["names"] if searched.get(name) is not None]
        lines.append(
            f"| {' = '.join(entry['names'])} | {point} | {found[0]:.1f} | {median} |"
            if found
            else f"| {' = '.join(entry['names'])} | {point} | - | {median} |"
        )
    share = (confirmation.get("tune_pick_over_grid_best") or {}).get("median")
    trials = summary["tune_trials_share_of_grid"]
    lines += [
        "",
        f"- {'MET' if share is not None and share >= GOAL_SHARE else 'MISS'}: tune's pick within "
        f"{round((1 - GOAL_SHARE) * 100)}% of the grid's best (side by side): {_ratio_text(confirmation.get('tune_pick_over_grid_best'))}",
        f"- {'MET' if trials is not None and trials <= GOAL_TRIALS else 'MISS'}: at most {round(GOAL_TRIALS * 100)}% of the grid's "
        f"trials: tune ran {summary['tune_trials']} of {document['grid']['points']} ({trials:.0%})",
        f"- tune's pick over the config as it is (side by side): {_ratio_text(confirmation.get('tune_pick_over_as_is'))}; the "
        f"grid's best over it: {_ratio_text(confirmation.get('grid_best_over_as_is'))}",
        "- plan's serving model against the grid's measurements, rank correlation (Spearman) over the grid: "
        + (f"{summary['model_rank_correlation_grid']:.2f}" if summary.get("model_rank_correlation_grid") is not None else "-"),
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="2 points, tiny benches; the result is written under --workdir")
    parser.add_argument("--workdir", type=Path, default=REPO / "forge-work" / "bench-tune", help="the grid's and tune's workdirs")
    parser.add_argument("--name", default="tune", help="the result file's name (results/bench_tune/NAME.json)")
    parser.add_argument("--note", default=None, help="a note stored with the results (e.g. that the machine was busy)")
    parser.add_argument("--out-dir", type=Path, default=None, help=f"default {RESULTS_DIR.relative_to(REPO)} (--smoke: the workdir)")
    args = parser.parse_args()
    document = {**record(), "note": args.note}
    from trtllm_forge.processes import sigterm_as_interrupt

    with sigterm_as_interrupt():
        document.update(run(args))
    out_dir = args.out_dir or (args.workdir / "smoke-result" if args.smoke else RESULTS_DIR)
    path = write_result(out_dir / f"{args.name}.json", finish(document))
    summary = document["summary"]
    print(f"wrote {path}", file=sys.stderr)
    for key, value in summary.items():
        print(f"  {key}: {value}", file=sys.stderr)
    print(render_table(document))


if __name__ == "__main__":
    main()
