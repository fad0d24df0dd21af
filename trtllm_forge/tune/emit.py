"""`tune --emit DIR` (a GPU host runs the trials) and `tune --import DIR` (their results answered here).

DIR holds `tune-emit.json` (the question and each trial's point, hash and prediction), `trials/<hash>/config.yaml`
(the trial's config, its first workload set to the trial's loads, requests and SLO) and `run_trials.sh`, which runs
`trtllm-forge run` on each config and keeps its JSON document in `results/<hash>/run.json` (with `exit_code` and the
log). A trial with results is skipped when the script runs again.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

from trtllm_forge.atomic_files import write_json_atomic, write_text_atomic
from trtllm_forge.config.schema import ForgeConfig
from trtllm_forge.errors import ConfigError
from trtllm_forge.tune.config_file import config_yaml
from trtllm_forge.tune.feasibility import apply_point
from trtllm_forge.tune.measure import best_goodput, load_points
from trtllm_forge.tune.rank import Predicted, aiconfigurator_prediction, predict, serving_instances
from trtllm_forge.tune.report import Row
from trtllm_forge.tune.slo import Goal, Objective, Slo
from trtllm_forge.tune.space import Point
from trtllm_forge.tune.trials import BenchPlan, TrialResult, trial_key
from trtllm_forge.tune.tuner import Prepared, answer

EMIT_FILE = "tune-emit.json"
SCRIPT = "run_trials.sh"


def with_trial_workload(config: ForgeConfig, bench: BenchPlan, slo: Slo) -> ForgeConfig:
    """The config whose first bench workload is the trial's measurement (its only workload)."""
    first = config.bench.workloads[0].model_dump(mode="json")
    workload = {**first, **bench.to_dict(), "request_rate": [], "slo_ms": slo.per_request_ms()}
    return apply_point(config, {"bench.workloads": [workload]})


def _script(hashes: list[str]) -> str:
    run = ["run", "$HERE/trials/$hash/config.yaml", "--workdir", "$HERE/work/$hash", "--skip-verify", "--json"]
    lines = [
        "#!/usr/bin/env bash",
        "# Written by `trtllm-forge tune --emit`: runs every trial, then `trtllm-forge tune CONFIG --import DIR` answers.",
        "# TRTLLM_FORGE: the command to run (default: trtllm-forge).",
        "set -euo pipefail",
        'HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"',
        'read -r -a FORGE <<<"${TRTLLM_FORGE:-trtllm-forge}"',
        "run_trial() {",
        '  local hash="$1" out="$HERE/results/$1" status=0',
        '  if [[ -f "$out/run.json" ]]; then echo "trial $hash: measured earlier"; return 0; fi',
        '  mkdir -p "$out"',
        '  "${FORGE[@]}" ' + " ".join(f'"{a}"' for a in run) + ' >"$out/run.json.part" 2>"$out/run.log" || status=$?',
        '  echo "$status" >"$out/exit_code"',
        '  mv "$out/run.json.part" "$out/run.json"',
        '  "${FORGE[@]}" deploy stop --workdir "$HERE/work/$hash" >/dev/null 2>&1 || true',
        '  echo "trial $hash: exit $status"',
        "}",
        *(f"run_trial {shlex.quote(h)}" for h in hashes),
        "",
    ]
    return "\n".join(lines)


def emit(prepared: Prepared, directory: Path, aiconfigurator: bool = False) -> dict[str, Any]:
    """The ranked points the budget allows (best predicted first) and the config as it is, as trial configs and one
    script (with `aiconfigurator`, each with AIConfigurator's simulation beside plan's). Returns the emitted document."""
    q = prepared.question
    requests = prepared.plan[-1].num_requests if prepared.plan else q.base_requests
    bench = BenchPlan(q.concurrencies, requests)
    chosen: list[tuple[Point, ForgeConfig, Predicted, bool]] = [
        (r.checked.point, r.config, r.predicted, False) for r in prepared.ranked[: max(1, q.budget - 1)]
    ]
    default_config = apply_point(q.config, {})
    chosen.append((prepared.default, default_config, predict(default_config, q.slo, list(q.concurrencies), q.objective), True))
    trials: list[dict[str, Any]] = []
    hashes: list[str] = []
    for point, config, predicted, is_default in chosen:
        key = trial_key(config, bench, q.slo)
        if key in hashes:  # the config as it is was also a point of the space
            trials[hashes.index(key)]["default"] = trials[hashes.index(key)]["default"] or is_default
            continue
        write_text_atomic(
            directory / "trials" / key / "config.yaml",
            config_yaml(with_trial_workload(config, bench, q.slo), f"tune trial {key}: {json.dumps(point)}"),
        )
        trial = {
            "hash": key,
            "point": point,
            "default": is_default,
            "predicted": predicted.to_dict(),
            "instances": serving_instances(config),
        }
        if aiconfigurator:
            trial["aiconfigurator"] = aiconfigurator_prediction(config)
        trials.append(trial)
        hashes.append(key)
    document = {
        "schema": "trtllm-forge.tune-emit/1",
        "config": q.config.name,
        "slo": q.slo.to_dict(),
        "objective": q.objective,
        "bench": bench.to_dict(),
        "trials": trials,
        "pruned": [{"point": c.point, "reasons": c.reasons} for c in prepared.pruned],
    }
    write_json_atomic(directory / EMIT_FILE, document)
    script = directory / SCRIPT
    write_text_atomic(script, _script(hashes))
    script.chmod(0o755)
    return {**document, "script": str(script)}


def _slo_of(data: dict[str, float]) -> Slo:
    goals = []
    for name, limit in data.items():
        metric, statistic, _ = name.split("_")
        goals.append(Goal(metric, statistic, float(limit)))
    return Slo(tuple(goals))


def import_results(config: ForgeConfig, directory: Path, workdir: Path) -> dict[str, Any]:
    """The answer from the results a GPU host wrote into `directory` by running the emitted script."""
    path = directory / EMIT_FILE
    try:
        emitted = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError("--import", f"{path}: not readable ({exc})", "pass the DIR that `tune --emit DIR` wrote") from None
    if emitted.get("config") != config.name:
        raise ConfigError(
            "--import",
            f"{directory} holds trials of config {emitted.get('config')!r}",
            f"pass the config it was emitted from, not {config.name!r}",
        )
    slo, objective = _slo_of(emitted["slo"]), emitted["objective"]
    rows, default_row, missing = [], None, 0
    for trial in emitted["trials"]:
        result = _trial_result(directory, trial, emitted["bench"], slo, objective)
        if result is None:
            missing += 1
            continue
        row = Row(result, Predicted(**trial["predicted"]), trial["instances"], trial["default"], trial.get("aiconfigurator"))
        rows.append(row)
        default_row = row if trial["default"] else default_row
    if not rows:
        raise ConfigError("--import", f"no results under {directory / 'results'}", f"run {directory / SCRIPT} on the GPU host first")
    measured = [r for r in rows if r.trial.done]
    best = max(measured, key=lambda r: r.trial.goodput) if measured else None
    extra: dict[str, Any] = {"trials_used": len(rows), "not_run": missing, "stopped": None, "imported_from": str(directory), "notes": []}
    return answer(config, workdir, slo, objective, rows, best, default_row, extra)


def _trial_result(directory: Path, trial: dict[str, Any], bench: dict[str, Any], slo: Slo, objective: Objective) -> TrialResult | None:
    out = directory / "results" / trial["hash"]
    try:
        document = json.loads((out / "run.json").read_text() or "{}")
    except FileNotFoundError:
        return None
    except ValueError:
        document = {}
    result = TrialResult(trial["hash"], trial["point"], "failed", 0.0, bench, directory=str(out))
    workloads = (document.get("bench") or {}).get("workloads") or []
    if workloads:
        result.points = load_points(workloads[0], slo, objective)
        result.goodput = best_goodput(result.points)
        result.status = "done"
    else:
        error = document.get("error") or {}
        result.error = error.get("message") if isinstance(error, dict) else str(error) or f"no bench results; see {out / 'run.log'}"
        result.error = result.error or f"no bench results; see {out / 'run.log'}"
    return result
