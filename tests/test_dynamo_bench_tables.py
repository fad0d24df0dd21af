"""scripts/bench_dynamo.py's blocks for docs/benchmarks/dynamo.md, on documents written here (no timing): medians over
repeats, ratios paired within a repeat, the goals' verdicts, CPU per output token by process."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

from conftest import load_script

REPO = Path(__file__).resolve().parent.parent


def _script() -> ModuleType:
    return load_script("bench_dynamo.py")


def _document(runs: list[dict[str, Any]]) -> dict[str, Any]:
    script = _script()
    return {
        "git_commit": "0123456789abcdef0123456789abcdef01234567",
        "git_dirty": False,
        "started_utc": "2026-12-05T03:00:00Z",
        "finished_utc": "2026-12-05T03:15:00Z",
        "machine": {"cpu_model": "Test CPU", "usable_cores": 2, "load_average": [1.0, 1.0, 1.0]},
        "workloads": {
            "routing": {
                "system_prompt_tokens": 600,
                "system_prompts": 9,
                "question_tokens": 32,
                "answer_tokens": 32,
                "turns": 3,
                "concurrency": 4,
                "requests": 48,
                "streamed": True,
            },
            "throughput": {"input_tokens": 64, "output_tokens": 64, "concurrency": 8, "requests": 32},
            "kv_tokens_per_engine": 5120,
        },
        "labels": script.PATH_LABELS,
        "repeats": 2,
        "runs": runs,
    }


def _routing(path: str, repeat: int, ttft: float) -> dict[str, Any]:
    return {
        "part": "routing",
        "path": path,
        "repeat": repeat,
        "completed": 48,
        "failed": 0,
        "ttft_ms_p50": ttft,
        "ttft_ms_p99": 2 * ttft,
        "tpot_ms_p50": 40.0,
        "tok_s": 50.0,
    }


def test_the_routing_goal_is_judged_on_ratios_paired_within_each_repeat():
    script = _script()
    # Medians alone: KV 150 vs round-robin 225 (0.67); paired per repeat: 0.5 and 0.8, median 0.65: met.
    runs = [_routing("kv", 0, 100.0), _routing("round-robin", 0, 200.0), _routing("kv", 1, 200.0), _routing("round-robin", 1, 250.0)]
    text = script.render_routing_table(_document(runs))
    assert "- MET: TTFT p50 with the KV router ≤ 0.7× round-robin's: 0.65× (per repeat: 0.50, 0.80)" in text
    assert "| Dynamo, 2 workers, KV router (KV events from the workers) | 2 | 150.0 | 300.0 |" in text
    slower = [_routing("kv", 0, 190.0), _routing("round-robin", 0, 200.0), {"part": "routing", "path": "kv", "repeat": 1, "error": "boom"}]
    text = script.render_routing_table(_document(slower))
    assert "- MISS:" in text and "0.95×" in text and "1 run(s) failed: kv r1: boom" in text


def _throughput(path: str, repeat: int, streamed: bool, tok_s: float, cpu: dict[str, float]) -> dict[str, Any]:
    return {
        "part": "throughput",
        "path": path,
        "repeat": repeat,
        "streamed": streamed,
        "completed": 32,
        "failed": 0,
        "tok_s": tok_s,
        "output_tokens": 2048,
        "cpu_s": cpu,
    }


def test_the_throughput_table_compares_with_triton_per_repeat_and_splits_cpu_by_process():
    script = _script()
    triton_cpu = {"tritonserver": 2.048, "stubs": 4.096, "client": 0.2048}
    dynamo_cpu = {"frontend": 1.024, "workers": 3.072, "client": 0.2048}
    runs = [
        _throughput("triton", 0, False, 100.0, triton_cpu),
        _throughput("dynamo-1", 0, False, 96.0, dynamo_cpu),
        _throughput("triton", 0, True, 100.0, triton_cpu),
        _throughput("dynamo-1", 0, True, 90.0, dynamo_cpu),
        _throughput("dynamo-2", 0, True, 120.0, dynamo_cpu),
    ]
    text = script.render_throughput_table(_document(runs))
    assert "- MET: Dynamo with 1 worker ≥ 95% of Triton's tok/s, not streamed: 96%" in text
    assert "- MISS: Dynamo with 1 worker ≥ 95% of Triton's tok/s, streamed: 90%" in text
    assert "| yes | Dynamo: frontend + 2 workers (KV router) | 1 | 120.0 | 1.20× | frontend 0.50 / workers 1.50 / client 0.10 | 0 |" in text
    assert "tritonserver 1.00 / stubs 2.00 / client 0.10" in text
