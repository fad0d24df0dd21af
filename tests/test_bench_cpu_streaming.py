"""scripts/bench_cpu_streaming.py sorts the inter-token gaps above the goal into slow engine steps (every stream
waited) and gaps alone (one token held back on its way out)."""

from __future__ import annotations

import importlib.util
import json

from conftest import REPO

spec = importlib.util.spec_from_file_location("bench_cpu_streaming", REPO / "scripts" / "bench_cpu_streaming.py")
assert spec is not None and spec.loader is not None
bench_cpu_streaming = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench_cpu_streaming)

MS = 1_000_000


def stream(name: str, stamps_ms: list[int], phase: str = "measure") -> str:
    responses = [{"recv_ns": t * MS, "tokens": 1} for t in stamps_ms]
    return json.dumps({"id": name, "phase": phase, "responses": responses})


def test_a_step_every_stream_waited_for_is_told_from_a_token_held_back_alone(tmp_path):
    steady = [0, 100, 200, 300, 400, 500]
    slow_step = [0, 100, 400, 500, 600, 700]  # the step after 100 ms took 300 ms for everyone
    lines = [stream(f"s{i}", slow_step) for i in range(4)]
    lines.append(stream("late", [0, 100, 400, 500, 750, 800]))  # the slow step too, then a token 250 ms late alone
    lines.append(stream("steady", steady))
    lines.append(stream("warmup", [0, 900], phase="warmup"))  # not counted
    records = tmp_path / "requests.jsonl"
    records.write_text("\n".join(lines) + "\n")

    counts = bench_cpu_streaming.slow_gaps(records, 150 * MS)

    assert counts == {"gaps_over_goal": 6, "gaps_over_goal_in_slow_steps": 5, "gaps_over_goal_alone": 1}


def test_no_records_no_counts(tmp_path):
    assert bench_cpu_streaming.slow_gaps(tmp_path / "requests.jsonl", 150 * MS) == {}
