"""scripts/bench_tune.py's block for docs/benchmarks/tune.md, on documents written here (no timing): the goals are
judged on the side-by-side confirmation round, a pick equal to the grid's best is one row, verdicts can fail."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

from conftest import load_script

REPO = Path(__file__).resolve().parent.parent


def _script() -> ModuleType:
    return load_script("bench_tune.py")


def _document(confirm_points: list[dict[str, Any]], ratios: dict[str, Any], tune_trials: int) -> dict[str, Any]:
    return {
        "git_commit": "0123456789abcdef0123456789abcdef01234567",
        "git_dirty": False,
        "started_utc": "2026-12-05T03:00:00Z",
        "finished_utc": "2026-12-05T03:20:00Z",
        "machine": {"cpu_model": "Test CPU", "usable_cores": 2, "load_average": [1.0, 1.0, 1.0]},
        "workload": {"concurrency": [8], "input_len": 64, "output_len": 32},
        "slo": {"ttft_p99_ms": 1000.0, "tpot_p50_ms": 100.0},
        "space": {"engine.max_batch_size": [4, 8, 16], "engine.max_num_tokens": [2048], "runtime.arrival_window_ms": [0, 20]},
        "grid": {"points": 6, "requests_per_load": 32},
        "summary": {
            "grid_best_goodput": 250.0,
            "tune_pick_goodput_by_tune": 240.0,
            "default_goodput_by_grid": 200.0,
            "tune_trials": tune_trials,
            "tune_trials_share_of_grid": tune_trials / 6,
            "model_rank_correlation_grid": 0.5,
        },
        "confirmation": {"repeats": 3, "points": confirm_points, **ratios},
    }


def test_the_verdicts_come_from_the_confirmation_round():
    script = _script()
    points = [
        {"names": ["grid best"], "point": {"engine.max_batch_size": 16}, "goodput": [250.0, 240.0, 260.0]},
        {"names": ["tune pick"], "point": {"engine.max_batch_size": 8}, "goodput": [200.0, 190.0, 210.0]},
        {"names": ["as is"], "point": {}, "goodput": [180.0, 170.0, None]},
    ]
    ratios = {
        "tune_pick_over_grid_best": {"per_repeat": [0.8, 0.79, 0.81], "median": 0.8},
        "tune_pick_over_as_is": {"per_repeat": [1.11, 1.12], "median": 1.115},
        "grid_best_over_as_is": {"per_repeat": [1.39, 1.41], "median": 1.4},
    }
    table = script.render_table(_document(points, ratios, tune_trials=1))
    assert "- MISS: tune's pick within 5% of the grid's best (side by side): 0.80×" in table
    assert "- MET: at most 30% of the grid's trials: tune ran 1 of 6 (17%)" in table
    assert "| tune pick | max_batch_size=8 | 240.0 | 200.0 |" in table
    assert "| as is | the config as it is | 200.0 | 175.0 |" in table  # a failed repeat is left out of the median
    assert "git 0123456789ab" in table.splitlines()[0]


def test_a_pick_that_is_the_grid_best_is_one_row_and_meets_the_goal():
    script = _script()
    points = [{"names": ["grid best", "tune pick"], "point": {"engine.max_batch_size": 16}, "goodput": [250.0, 240.0, 260.0]}]
    ratios = {"tune_pick_over_grid_best": {"per_repeat": [1.0, 1.0, 1.0], "median": 1.0}}
    table = script.render_table(_document(points, ratios, tune_trials=3))
    assert "| grid best = tune pick | max_batch_size=16 | 250.0 | 250.0 |" in table
    assert "- MET: tune's pick within 5%" in table and "- MISS: at most 30% of the grid's trials: tune ran 3 of 6 (50%)" in table
