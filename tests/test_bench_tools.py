"""perf_analyzer, GenAI-Perf and AIPerf for real: `bench import` on other people's export files, `bench --tool`
and the `--emit` commands run against real Triton servers, and the OpenAI target's retry of requests that a
closed keep-alive connection never delivered."""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import subprocess
import threading
from pathlib import Path

import pytest
from bench_helpers import GAP_MS, TTFT_MS, bench_json, bench_run, read_records
from cli_inprocess import run_in_process
from conftest import REPO

from trtllm_forge.bench.perf_analyzer import find_perf_analyzer, problem

# CI lays shared/ beside the clone; worktrees find it the same way (<repo>/../shared, then /work/shared).
EXPORTS = next((p for p in (REPO.parent / "shared" / "bench_exports", REPO.parent.parent / "shared" / "bench_exports") if p.is_dir()), None)
needs_exports = pytest.mark.skipif(EXPORTS is None, reason=f"no shared/bench_exports beside the repository ({REPO.parent / 'shared'})")
PA_PROBLEM = problem()
needs_perf_analyzer = pytest.mark.skipif(PA_PROBLEM is not None, reason=f"perf_analyzer cannot run: {PA_PROBLEM}")
NS = 1e-6  # a nanosecond in ms: the shared PA exports carry small synthetic integer timestamps in ns


def _import(*paths: Path, out: Path, extra: tuple[str, ...] = ()) -> list[dict]:
    """`bench import` through the CLI (in this process); the summaries of every point written, per export."""
    proc, doc = bench_json("import", *map(str, paths), "--out", str(out), *extra, in_process=True)
    assert proc.returncode == 0, proc.stderr
    runs = []
    for run in doc["runs"]:
        run = Path(run)
        if (run / "sweep.json").is_file():
            runs.append(json.loads((run / "sweep.json").read_text())["points"])
        else:
            runs.append([json.loads((run / "summary.json").read_text())])
    return runs


# ---- bench import on real files ------------------------------------------------------------------------


@needs_exports
def test_perf_analyzer_raw_exports_give_genai_perf_metrics_from_timestamps(tmp_path):
    pa = EXPORTS / "perf_analyzer_exports"
    chat, engine, completions = _import(
        pa / "derived_openai_profile_data.profile_export.json",
        pa / "derived_tensorrtllm_engine_profile_data.profile_export.json",
        pa / "derived_openai_completions_profile_data.profile_export.json",
        out=tmp_path,
    )
    # Chat: role-only chunk, three content chunks, an empty delta, [DONE]: only content chunks are timing points.
    m = chat[0]["metrics"]
    assert chat[0]["source"] == "perf_analyzer" and chat[0]["load"]["value"] == 10
    assert m["ttft_ms"]["min"] == pytest.approx(4 * NS) and m["ttft_ms"]["max"] == pytest.approx(5 * NS)
    assert m["e2e_ms"]["min"] == pytest.approx(11 * NS) and m["e2e_ms"]["max"] == pytest.approx(13 * NS)
    assert sorted([m["itl_ms"]["min"] / NS, m["itl_ms"]["max"] / NS]) == pytest.approx([3, 4]) and m["itl_ms"]["count"] == 4
    assert chat[0]["requests"]["completed"] == 2 and chat[0]["self_checks"]["empty_responses"] == 6
    # TensorRT-LLM engine (C API): output_ids counted, one point per experiment (concurrency 10, rate 2).
    assert [p["load"]["mode"] for p in engine] == ["concurrency", "rate"] and engine[1]["load"]["value"] == 2.0
    m = engine[0]["metrics"]
    assert [m["ttft_ms"]["min"] / NS, m["ttft_ms"]["max"] / NS] == pytest.approx([2, 2])
    assert [m["e2e_ms"]["min"] / NS, m["e2e_ms"]["max"] / NS] == pytest.approx([7, 9])
    assert [m["tpot_ms"]["min"] / NS, m["tpot_ms"]["max"] / NS] == pytest.approx([2.5, 3.5])  # (E2E - TTFT) / (OSL - 1)
    assert engine[0]["output_tokens_sources"] == {"server_ids": 2} and m["output_tokens"]["max"] == 3
    assert engine[1]["metrics"]["e2e_ms"]["max"] / NS == pytest.approx(13)
    # Completions: every text chunk counts, [DONE] does not.
    assert completions[0]["metrics"]["output_tokens"]["max"] == 4 and completions[0]["metrics"]["ttft_ms"]["min"] / NS == pytest.approx(2)


@needs_exports
def test_aiperf_summary_json_and_csv_and_genai_perf_analyze_csv(tmp_path):
    ai = EXPORTS / "aiperf_dev_results_smoke_100k"
    (json_point,), (csv_point,), analyze = _import(
        ai / "profile_export_aiperf.json",
        ai / "profile_export_aiperf.csv",
        EXPORTS / "genai_perf_analyze" / "analyze_export_genai_perf.csv",
        out=tmp_path,
    )
    for point in (json_point, csv_point):
        assert point["source"] == "aiperf"
        assert point["metrics"]["ttft_ms"]["p50"] == pytest.approx(9539.09, abs=0.01)
        assert point["metrics"]["tpot_ms"]["avg"] == pytest.approx(65.79, abs=0.01)  # AIPerf's inter_token_latency
        assert point["metrics"]["e2e_ms"]["p99"] == pytest.approx(54340.44, abs=0.01)
        assert point["metrics"]["request_throughput_per_s"]["avg"] == pytest.approx(3400.22, abs=0.01)
        assert point["requests"]["completed"] == 481414
    assert csv_point["requests"]["failed"] == 18586
    assert [p["config_name"] for p in analyze] == [f"gpt2_run_config_{k}" for k in (3, 0, 4, 1, 2)]
    first = analyze[0]
    assert first["load"] == {"mode": "concurrency", "value": 32}
    assert first["metrics"]["ttft_ms"]["p99"] == 184.43 and first["metrics"]["output_token_throughput_per_s"]["avg"] == 1134.92
    assert first["metrics"]["request_throughput_per_s"]["avg"] == 10.12


# Formats without a real file in shared/bench_exports: fixtures written here from the documented layouts
# (AIPerf's examples/artifacts: the older `records` JSON and per-request JSONL with credit_phase/timestamp_ns;
# GenAI-Perf's CSV with a quoted thousands separator and its JSON).

_OLD_AIPERF_JSON = {
    "records": {
        "ttft": {"tag": "ttft", "unit": "ms", "header": "Time to First Token", "avg": 120.0, "p50": 110.0, "p99": 300.0, "count": 40},
        "inter_token_latency": {"tag": "inter_token_latency", "unit": "ms", "avg": 21.5, "p50": 21.0, "count": 40},
        "inter_chunk_latency": {"tag": "inter_chunk_latency", "unit": "ms", "avg": 22.0, "p50": 20.5, "count": 800},
        "request_latency": {"tag": "request_latency", "unit": "ms", "avg": 900.0, "p50": 880.0, "count": 40},
        "request_count": {"tag": "request_count", "unit": "requests", "avg": 40.0, "count": 1},
        "error_request_count": {"tag": "error_request_count", "unit": "requests", "avg": 2.0, "count": 1},
        "request_throughput": {"tag": "request_throughput", "unit": "requests/sec", "avg": 4.25, "count": 1},
        "output_token_throughput": {"tag": "output_token_throughput", "unit": "tokens/sec", "avg": 170.0, "count": 1},
    },
    "input_config": {"loadgen": {"concurrency": 8}},
}


def _old_aiperf_jsonl(n: int) -> str:
    lines = []
    for i in range(n):
        meta = {"x_request_id": f"r{i}", "timestamp_ns": 10**18 + i * 10**8, "credit_phase": "warmup" if i == 0 else "profiling"}
        metrics = {
            "ttft": {"value": 50.0 + i, "unit": "ms"},
            "request_latency": {"value": 200.0, "unit": "ms"},
            "inter_chunk_latency": {"value": [10.0, 12.0], "unit": "ms"},
            "inter_token_latency": {"value": 11.0, "unit": "ms"},
            "output_sequence_length": {"value": 3, "unit": "tokens"},
        }
        lines.append(json.dumps({"metadata": meta, "metrics": metrics, "error": None}))
    lines.append(
        json.dumps(
            {
                "metadata": {"timestamp_ns": 10**18, "credit_phase": "profiling"},
                "metrics": {},
                "error": {"code": 499, "type": "RequestCancellationError", "message": "cancelled"},
            }
        )
    )
    return "\n".join(lines) + "\n"


def test_documented_formats_older_aiperf_and_genai_perf_json_csv(tmp_path):
    old_json = tmp_path / "old" / "profile_export_aiperf.json"
    old_json.parent.mkdir()
    old_json.write_text(json.dumps(_OLD_AIPERF_JSON))
    jsonl = tmp_path / "jsonl" / "profile_export.jsonl"
    jsonl.parent.mkdir()
    jsonl.write_text(_old_aiperf_jsonl(6))
    gp_csv = tmp_path / "profile_export_genai_perf.csv"
    gp_csv.write_text(
        "Metric,avg,min,max,p99,p95,p90,p75,p50,p25,p10,p5,p1\n"
        '"Request Latency (ms)","1,204.50","1,001.00","1,500.00","1,490.00",1480,1470,1300,"1,200.00",1100,1050,1020,1005\n'
        "Time To First Token (ms),30.00,20.00,40.00,39.00,38.00,37.00,35.00,31.00,25.00,22.00,21.00,20.00\n"
        '\nMetric,Value\n"Output Token Throughput (per sec)","2,345.60"\nRequest Throughput (per sec),12.50\nRequest Count (count),40\n'
    )
    gp_json = tmp_path / "profile_export_genai_perf.json"
    gp_json.write_text(
        json.dumps(
            {
                "time_to_first_token": {"unit": "ms", "avg": 31.0, "p50": 30.0, "p99": 45.0},
                "inter_token_latency": {"unit": "ms", "avg": 5.5, "p50": 5.0},
                "request_throughput": {"unit": "requests/sec", "avg": 9.5},
                "input_config": {"perf_analyzer": {"stimulus": {"concurrency": 4}}},
            }
        )
    )
    (old,), (per_request,), (csv_point,), (json_point,) = _import(old_json, jsonl.parent, gp_csv, gp_json, out=tmp_path / "imp")
    assert old["source"] == "aiperf" and old["metrics"]["ttft_ms"]["p50"] == 110.0 and old["metrics"]["itl_ms"]["p50"] == 20.5
    assert old["requests"] == {"sent": None, "completed": 40, "failed": 2} and old["load"] == {"mode": "concurrency", "value": 8}
    # warm-up record dropped, the error counted, pooled chunk gaps, throughput over first start -> last end
    assert per_request["requests"] == {"sent": 6, "completed": 5, "failed": 1}
    assert per_request["metrics"]["ttft_ms"]["p50"] == 53.0 and per_request["metrics"]["itl_ms"]["count"] == 10
    assert per_request["metrics"]["request_throughput_per_s"]["avg"] == pytest.approx(5 / 0.6)
    assert csv_point["source"] == "genai-perf" and csv_point["metrics"]["e2e_ms"]["avg"] == 1204.5
    assert csv_point["metrics"]["e2e_ms"]["p50"] == 1200.0 and csv_point["metrics"]["output_token_throughput_per_s"]["avg"] == 2345.6
    assert json_point["metrics"]["tpot_ms"]["avg"] == 5.5 and json_point["load"] == {"mode": "concurrency", "value": 4}


@needs_exports
def test_unreadable_exports_exit_2_with_one_line_naming_the_file(tmp_path):
    cases = {
        "notes.txt": "just some text\n",
        "other.json": json.dumps({"hello": 1}),
        "table.csv": "a,b\n1,2\n",
        "broken.json": '{"records": ',
        "profile_export.json": "",  # what perf_analyzer 2.51 once left after exiting 0
    }
    for name, text in cases.items():
        path = tmp_path / name
        path.write_text(text)
        proc = run_in_process("bench", "import", str(path), "--out", str(tmp_path / "out"))
        assert proc.returncode == 2, (name, proc.stderr)
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and str(path) in lines[0] and "perf_analyzer profile_export.json" in lines[0], proc.stderr
        assert "Traceback" not in proc.stderr
    assert "profile_export.json: is empty" in proc.stderr, proc.stderr
    # A perf_analyzer export whose responses carry no token has no metric: an error, not an empty summary.
    empty = EXPORTS / "perf_analyzer_exports" / "derived_empty_profile_data.profile_export.json"
    proc = run_in_process("bench", "import", str(empty), "--out", str(tmp_path / "out"))
    assert proc.returncode == 2 and "no metric value" in proc.stderr, proc.stderr
    assert not (tmp_path / "out").exists()  # nothing half-written


# ---- the real perf_analyzer against real servers ----------------------------------------------------------


def test_perf_analyzer_binary_is_installed_and_located():
    """`make setup` installs it; doctor and the tests use the same locator."""
    found = find_perf_analyzer()
    assert PA_PROBLEM is None, PA_PROBLEM
    assert found.version() == "2.51.0" and found.missing_libraries() == []
    assert any((d / "libcudart.so.12").is_file() for d in found.lib_dirs)


def test_tools_run_without_the_grpc_settings_trtllm_forge_defaulted_for_itself():
    """Our processes default GRPC_ENABLE_FORK_SUPPORT and grpc's client poller (see trtllm_forge/__init__.py);
    perf_analyzer, GenAI-Perf and AIPerf get the user's environment: a value the user set is passed on, ours is not."""
    import trtllm_forge
    from trtllm_forge.bench.tools.registry import tool

    names = trtllm_forge._DEFAULTED
    if not names:
        pytest.skip("every grpc setting was chosen before trtllm_forge was imported: nothing of ours to leave out")
    for name in names:
        assert os.environ[name] == trtllm_forge.GRPC_DEFAULTS[name]
        assert name not in trtllm_forge.third_party_env()
        assert trtllm_forge.third_party_env({name: "user's", "A": "1"}) == {name: "user's", "A": "1"}
        if PA_PROBLEM is None:
            assert name not in find_perf_analyzer().env()
            assert name not in tool("perf_analyzer").executable().env


def test_a_child_that_inherits_our_whole_environment_still_knows_our_grpc_defaults_from_the_users():
    """A pytest-xdist worker (or a user's script) inherits the environment of a process that imported us: the values
    we defaulted there are still ours in the child (left out of what it passes on), while the same values set by
    the user, without our marker, are the user's."""
    import subprocess
    import sys

    import trtllm_forge

    probe = (
        "import json, os, trtllm_forge\n"
        "print(json.dumps([list(trtllm_forge._DEFAULTED), sorted(k for k in trtllm_forge.third_party_env() if k.startswith('GRPC_'))]))"
    )
    ours = {**os.environ, **trtllm_forge.GRPC_DEFAULTS, trtllm_forge.DEFAULTED_MARKER: ",".join(trtllm_forge.GRPC_DEFAULTS)}
    users = {k: v for k, v in ours.items() if k != trtllm_forge.DEFAULTED_MARKER}
    results = []
    for env in (ours, users):
        done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        results.append(json.loads(done.stdout))
    (defaulted, passed_on), (users_defaulted, users_passed_on) = results
    assert defaulted == list(trtllm_forge.GRPC_DEFAULTS) and not set(passed_on) & set(trtllm_forge.GRPC_DEFAULTS)
    assert users_defaulted == [] and set(trtllm_forge.GRPC_DEFAULTS) <= set(users_passed_on)


def _scripted_tool(tmp_path: Path, outcomes: list[tuple], export: Path | None = None) -> list[str]:
    """A process that stands in for perf_analyzer's exit only (not its measurement): each call prints the next
    outcome's text and exits with its code; an outcome's third item, if any, is what it leaves in `export`, which
    must not exist before (perf_analyzer 2.51 exits 99 then: "Failed to parse --profile-export-file. Path must not
    already exist."); calls are counted in `calls`."""
    import sys

    (tmp_path / "outcomes.json").write_text(json.dumps(outcomes))
    script = tmp_path / "tool.py"
    script.write_text(
        "import json, pathlib, sys\n"
        f"here = pathlib.Path({str(tmp_path)!r})\n"
        "calls = here / 'calls'\n"
        "n = int(calls.read_text()) if calls.exists() else 0\n"
        "calls.write_text(str(n + 1))\n"
        "code, text, *left = json.loads((here / 'outcomes.json').read_text())[n]\n"
        f"export = {str(export) if export else None!r}\n"
        "if export and pathlib.Path(export).exists():\n"
        "    print('Error: Failed to parse --profile-export-file. Path must not already exist.')\n"
        "    sys.exit(99)\n"
        "if export and left:\n"
        "    pathlib.Path(export).write_text(left[0])\n"
        "print(text)\n"
        "sys.exit(code)\n"
    )
    return [sys.executable, str(script)]


def test_perf_analyzers_statistics_race_reruns_a_measured_point_and_passes_a_warmup(tmp_path):
    """perf_analyzer 2.51's "failed to find the requested model version" (its server-statistics race, seen in CI at
    concurrency 2 on a busy machine): the warm-up goes on, a measured point runs again with the failed log kept;
    any other failure is raised at once."""
    from trtllm_forge.bench.tools.perf_analyzer import PA_ATTEMPTS, PA_STATS_RACE, run_perf_analyzer
    from trtllm_forge.errors import StepError

    race = (99, f"Request concurrency: 2\n{PA_STATS_RACE}")
    argv = _scripted_tool(tmp_path, [race, race, (0, "ok")])
    log = tmp_path / "run" / "perf_analyzer.log"
    run_perf_analyzer(argv, dict(os.environ), log, 60, warmup=False)
    assert (tmp_path / "calls").read_text() == "3"
    assert "ok" in log.read_text()
    assert PA_STATS_RACE in (log.parent / "perf_analyzer.attempt1.log").read_text()
    assert PA_STATS_RACE in (log.parent / "perf_analyzer.attempt2.log").read_text()

    other = tmp_path / "other"
    other.mkdir()
    with pytest.raises(StepError, match="exited with 99: error: model not found"):
        run_perf_analyzer(_scripted_tool(other, [(99, "error: model not found")]), dict(os.environ), other / "pa.log", 60, warmup=False)

    warm = tmp_path / "warm"
    warm.mkdir()
    run_perf_analyzer(_scripted_tool(warm, [race]), dict(os.environ), warm / "warmup.log", 60, warmup=True)
    assert (warm / "calls").read_text() == "1"

    endless = tmp_path / "endless"
    endless.mkdir()
    with pytest.raises(StepError, match="exited with 99"):
        run_perf_analyzer(_scripted_tool(endless, [race] * PA_ATTEMPTS), dict(os.environ), endless / "pa.log", 60, warmup=False)


def test_an_empty_profile_export_after_exit_0_runs_the_point_again_and_then_says_so(tmp_path):
    """perf_analyzer 2.51 once exited 0 with its console report complete and an empty profile export (full test run,
    2026-12-03): the point runs again with the empty attempt's log kept; empty every time, one line says what
    happened instead of the importer's "not a format I know"."""
    from trtllm_forge.bench.tools.perf_analyzer import PA_ATTEMPTS, PA_EMPTY_EXPORT, run_perf_analyzer
    from trtllm_forge.errors import StepError

    export = tmp_path / "profile_export.json"
    argv = _scripted_tool(tmp_path, [(0, "report one", ""), (0, "report two", '{"experiments": []}')], export)
    log = tmp_path / "run" / "perf_analyzer.log"
    run_perf_analyzer(argv, dict(os.environ), log, 60, warmup=False, export=export)
    assert (tmp_path / "calls").read_text() == "2"
    assert json.loads(export.read_text()) == {"experiments": []}
    assert "report two" in log.read_text()
    assert "report one" in (log.parent / "perf_analyzer.attempt1.log").read_text()
    assert (tmp_path / "profile_export.attempt1.json").read_text() == ""  # kept aside: perf_analyzer refuses a path that exists

    always = tmp_path / "always"
    always.mkdir()
    empty = always / "profile_export.json"
    argv = _scripted_tool(always, [(0, "report", "")] * PA_ATTEMPTS, empty)
    with pytest.raises(StepError, match=f"{PA_EMPTY_EXPORT} .*{PA_ATTEMPTS} times"):
        run_perf_analyzer(argv, dict(os.environ), always / "pa.log", 60, warmup=False, export=empty)
    assert (always / "calls").read_text() == str(PA_ATTEMPTS)


@pytest.mark.slow
@needs_perf_analyzer
def test_bench_tool_perf_analyzer_on_the_timing_model_matches_the_schedule_and_compares(timing_triton, tmp_path):
    common = {"concurrency": "1,4", "num_requests": 12, "input_len": 8, "output_len": 6}
    proc, doc = bench_run(timing_triton.grpc_url, tool="perf_analyzer", out=tmp_path / "pa", **common)
    assert proc.returncode == 0, proc.stderr
    assert [p["load"]["value"] for p in doc["points"]] == [1, 4]
    for point in doc["points"]:
        m = point["metrics"]
        assert point["source"] == "perf_analyzer" and point["requests"]["completed"] == 12 and point["requests"]["failed"] == 0
        # The schedule is a lower bound no response can beat (how late this busy machine is, is the fidelity script's job):
        # first token >= TTFT after the request, last token >= TTFT + 5 gaps after it.
        assert m["ttft_ms"]["min"] >= TTFT_MS and m["e2e_ms"]["min"] >= TTFT_MS + 5 * GAP_MS, (m["ttft_ms"], m["e2e_ms"])
        assert m["ttft_ms"]["p50"] < 10 * TTFT_MS and m["itl_ms"]["count"] == 12 * 5  # ms, not ns or s; 5 gaps a request
        assert m["output_tokens"]["min"] == m["output_tokens"]["max"] == 6  # min_tokens forced the length, counted by the server
        assert point["output_tokens_sources"] == {"server_count": 12}
        assert point["target"]["forced_output_len"].startswith("min_tokens")
        assert point["self_checks"]["empty_responses"] == 12  # PA's null final response per request: counted, not timed
        argv = point["tool_run"]["argv"]
        assert "--streaming" in argv and argv[argv.index("-i") + 1] == "grpc"
        sent = json.loads(Path(argv[argv.index("--input-data") + 1]).read_text())["data"]
        assert len(sent) == 12 and sent[0]["min_tokens"]["content"] == [6] and sent[0]["max_tokens"]["content"] == [6]
    assert len(read_records(tmp_path / "pa" / "c4")) == 12
    proc, _ours = bench_run(timing_triton.grpc_url, out=tmp_path / "forge", **common)
    assert proc.returncode == 0, proc.stderr
    # the same prompts, in the same order, as our own client sent
    assert len(read_records(tmp_path / "forge" / "c1")) == 14  # 12 + 2 warm-up
    proc, table = bench_json("compare", str(tmp_path / "forge"), str(tmp_path / "pa"), in_process=True)
    assert proc.returncode == 0, proc.stderr
    rows = table["runs"]
    assert [(r["source"], r["load"]) for r in rows] == [
        ("trtllm-forge", "c=1"),
        ("trtllm-forge", "c=4"),
        ("perf_analyzer", "c=1"),
        ("perf_analyzer", "c=4"),
    ]
    assert all(row["tpot_ms_p50"] and row["ttft_ms_p50"] >= TTFT_MS and row["failed"] == 0 for row in rows)


@pytest.mark.slow
@needs_perf_analyzer
def test_every_emitted_perf_analyzer_command_runs_and_imports(timing_triton, tmp_path):
    proc, doc = bench_run(
        timing_triton.grpc_url,
        concurrency=2,
        num_requests=6,
        input_len=5,
        output_len=4,
        out=tmp_path / "w",
        extra=("--request-rate", "5", "--arrival", "constant", "--emit", "perf_analyzer"),
    )
    assert proc.returncode == 0, proc.stderr
    (emitted,) = doc["emitted"]
    script = Path(emitted["files"][1]).read_text().splitlines()
    commands = [shlex.split(line) for line in script if line.startswith("perf_analyzer ")]
    assert len(commands) == 2 and [shlex.join(c) for c in commands] == emitted["commands"]
    pa = find_perf_analyzer()
    for argv in commands:
        result = subprocess.run([str(pa.binary), *argv[1:]], capture_output=True, text=True, env=pa.env(), timeout=120)
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    exports = sorted((tmp_path / "w" / "emit").glob("pa_*.json"))
    points = [p for run in _import(*exports, out=tmp_path / "imp") for p in run]
    assert [p["load"]["mode"] for p in points] == ["concurrency", "rate"]
    for point in points:
        assert point["requests"]["completed"] == 6 and point["metrics"]["output_tokens"]["min"] == 4
        assert point["metrics"]["ttft_ms"]["p50"] >= TTFT_MS


@pytest.mark.slow
@needs_perf_analyzer
def test_bench_tool_perf_analyzer_on_the_cpu_engine_with_token_ids(cpu_engine_server, smollm2_checkpoint, tmp_path):
    """The real CPU engine (OpenVINO SmolLM2 behind the tensorrt_llm model contract), driven by perf_analyzer."""
    proc, doc = bench_run(
        cpu_engine_server.grpc_url,
        target="triton-grpc-tokens",
        model="tensorrt_llm",
        tokenizer=smollm2_checkpoint,
        concurrency=2,
        num_requests=4,
        input_len=16,
        output_len=8,
        tool="perf_analyzer",
        out=tmp_path / "cpu",
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    assert doc["requests"]["completed"] == 4 and doc["requests"]["failed"] == 0
    assert doc["metrics"]["output_tokens"]["min"] == doc["metrics"]["output_tokens"]["max"] == 8
    assert doc["metrics"]["input_tokens"]["min"] == 16 and doc["output_tokens_sources"] == {"server_ids": 4}
    assert doc["metrics"]["ttft_ms"]["p50"] > 0 and doc["metrics"]["tpot_ms"]["p50"] > 0


@pytest.mark.slow
def test_emitted_genai_perf_command_runs_when_installed(timing_triton, smollm2_checkpoint, tmp_path):
    """GenAI-Perf lives in its own venv (FORGE_GENAI_PERF=<venv>/bin/genai-perf; see README); skipped without it."""
    exe = os.environ.get("FORGE_GENAI_PERF")
    if not exe or PA_PROBLEM:
        pytest.skip(f"GenAI-Perf not configured (FORGE_GENAI_PERF unset) or perf_analyzer missing: {PA_PROBLEM}")
    proc, doc = _small_run(timing_triton.grpc_url, smollm2_checkpoint, tmp_path / "gp", tool="genai-perf", num_requests=6, output_len=5)
    assert proc.returncode == 0, proc.stderr
    argv = doc["tool_run"]["argv"]
    assert "--service-kind" not in argv and "--output-tokens-mean-deterministic" not in argv
    assert argv[argv.index("--endpoint-type") + 1] == "kserve" and "min_tokens:5" in argv
    assert doc["source"] == "genai-perf" and doc["metrics"]["ttft_ms"]["p50"] >= TTFT_MS
    assert doc["metrics"]["output_tokens"]["avg"] == pytest.approx(5, abs=0.5)
    _run_emitted("genai-perf", exe, timing_triton.grpc_url, smollm2_checkpoint, tmp_path)


def _small_run(url: str, tokenizer: Path, out: Path, **options):
    """bench_run of 2 concurrent requests of 8 prompt tokens (our tokenizer), as the GenAI-Perf and AIPerf tests make them."""
    return bench_run(url, concurrency=2, input_len=8, tokenizer=tokenizer, out=out, timeout=600, **options)


def _run_emitted(tool: str, exe: str, url: str, tokenizer: Path, tmp_path: Path, target: str | None = None) -> None:
    """Run the command `--emit TOOL` prints, as printed (only the executable's path filled in), and import its export."""
    from trtllm_forge.bench.tools.registry import tool as bench_tool

    proc, doc = _small_run(url, tokenizer, tmp_path / "emit", target=target, num_requests=4, output_len=4, extra=("--emit", tool))
    assert proc.returncode == 0, proc.stderr
    (command,) = doc["emitted"][0]["commands"]
    argv = shlex.split(command)
    assert argv[0] == tool
    env = bench_tool(tool).executable().env
    result = subprocess.run([exe, *argv[1:]], capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (point,) = _import(Path(argv[argv.index("--artifact-dir") + 1]), out=tmp_path / "emit-imported")[0]
    assert point["source"] == tool and point["metrics"]["ttft_ms"]["p50"] >= TTFT_MS
    assert point["metrics"]["output_tokens"]["avg"] == pytest.approx(4, abs=0.5)


# ---- OpenAI target: a keep-alive connection the server already closed --------------------------------------


def _closing_openai_server() -> tuple[str, callable, dict]:
    """An OpenAI-compatible streaming server (raw HTTP/1.1 on asyncio) that answers one request per connection
    and keeps the connection open without `Connection: close`; the next request on it is met by a close, with
    nothing read or answered: what a pooled keep-alive connection that llama.cpp's llama-server already dropped
    looks like to the client (`Can not write request body` / `ServerDisconnectedError`)."""
    seen = {"requests": 0, "dropped": 0}

    async def handle(reader, writer):
        answered = False
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                if answered:
                    seen["dropped"] += 1
                    break
                lines = head.decode().split("\r\n")
                length = next((int(line.split(":", 1)[1]) for line in lines if line.lower().startswith("content-length:")), 0)
                body = json.loads(await reader.readexactly(length)) if length else {}
                if lines[0].startswith("GET /v1/models"):
                    payload = json.dumps({"data": [{"id": "closing"}]}).encode()
                    writer.write(
                        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(payload) + payload
                    )
                else:
                    seen["requests"] += 1
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
                    events = [f"data: {json.dumps({'choices': [{'index': 0, 'text': ' tok'}]})}\n\n"] * int(body.get("max_tokens", 4))
                    for event in [*events, "data: [DONE]\n\n"]:
                        await asyncio.sleep(0.002)
                        data = event.encode()
                        writer.write(b"%x\r\n%s\r\n" % (len(data), data))
                        await writer.drain()
                    writer.write(b"0\r\n\r\n")
                await writer.drain()
                answered = True
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    loop = asyncio.new_event_loop()
    server = loop.run_until_complete(asyncio.start_server(handle, "127.0.0.1", 0))
    port = server.sockets[0].getsockname()[1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    def stop():
        loop.call_soon_threadsafe(server.close)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)

    return f"http://127.0.0.1:{port}", stop, seen


def test_openai_requests_on_a_closed_keepalive_connection_are_retried_not_failed(tmp_path):
    url, stop, seen = _closing_openai_server()
    try:
        proc, doc = bench_run(
            url, target="openai", model="closing", concurrency=2, num_requests=12, warmup=0, output_len=3, out=tmp_path / "o", timeout=120
        )
    finally:
        stop()
    assert proc.returncode == 0, proc.stderr
    assert doc["requests"]["completed"] == 12 and doc["requests"]["failed"] == 0
    assert seen["dropped"] >= 1 and doc["requests"]["retries"] == seen["dropped"], (seen, doc["requests"])
    assert seen["requests"] == 12  # a retried request reached the server once
    records = read_records(tmp_path / "o")
    assert sum(r["retries"] for r in records) == doc["requests"]["retries"]
    assert all(r["output_tokens"] == 3 for r in records)


@pytest.mark.slow
def test_bench_tool_aiperf_over_http_when_installed(timing_triton, smollm2_checkpoint, tmp_path):
    """AIPerf lives in its own venv (FORGE_AIPERF=<venv>/bin/aiperf; see README); skipped without it."""
    exe = os.environ.get("FORGE_AIPERF")
    if not exe:
        pytest.skip("AIPerf not configured (FORGE_AIPERF unset)")
    proc, doc = _small_run(
        timing_triton.http_url, smollm2_checkpoint, tmp_path / "ai", target="triton-http", tool="aiperf", num_requests=6, output_len=5
    )
    assert proc.returncode == 0, proc.stderr
    template = Path(doc["tool_run"]["argv"][doc["tool_run"]["argv"].index("--extra-inputs") + 1].split(":", 1)[1]).read_text()
    assert '"min_tokens": {{ max_tokens }}' in template and "generate_stream" in " ".join(doc["tool_run"]["argv"])
    assert doc["source"] == "aiperf" and doc["requests"]["completed"] == 6
    assert doc["metrics"]["ttft_ms"]["p50"] >= TTFT_MS and doc["metrics"]["output_tokens"]["avg"] == 5
    _run_emitted("aiperf", exe, timing_triton.http_url, smollm2_checkpoint, tmp_path, target="triton-http")


def test_fidelity_script_refuses_a_tokenizer_that_miscounts_the_timing_models_tokens(smollm2_checkpoint, tmp_path, monkeypatch):
    """GenAI-Perf's TPOT divides by the tokens its --tokenizer counts: a byte-level tokenizer without merges counts
    " tok" as 4 tokens (a GGUF-derived one counted 2 and halved GenAI-Perf's TPOT); SmolLM2's counts 1."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    monkeypatch.syspath_prepend(str(REPO / "scripts"))
    import bench_tools_fidelity as script

    script.check_tokenizer(smollm2_checkpoint)
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    bytes_only = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    bytes_only.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    PreTrainedTokenizerFast(tokenizer_object=bytes_only).save_pretrained(tmp_path / "bytes")
    with pytest.raises(SystemExit, match=f"counts {4 * script.OSL} tokens in the timing model's {script.OSL} responses"):
        script.check_tokenizer(tmp_path / "bytes")


# ---- bench --tool genai-perf / aiperf: our side of the run, with a stand-in for the tool's process ---------------

_STAND_IN = """#!{python}
# Stands in for {tool}'s process only (neither is installed here): records how it was called and leaves an export
# in the documented layout in --artifact-dir, as the real tool does after measuring.
import json, os, pathlib, sys
artifacts = pathlib.Path(sys.argv[sys.argv.index("--artifact-dir") + 1])
artifacts.mkdir(parents=True, exist_ok=True)
pathlib.Path({called!r}).write_text(json.dumps({{"argv": sys.argv, "path": os.environ.get("PATH", ""), "cwd": os.getcwd()}}))
export = {{"time_to_first_token": {{"unit": "ms", "avg": 41.0, "p50": 40.5}}, "request_count": {{"avg": 6}}}}
(artifacts / {export!r}).write_text(json.dumps(export))
"""


@pytest.mark.parametrize(
    ("tool", "env_var", "target", "export"),
    [
        ("genai-perf", "FORGE_GENAI_PERF", "triton-grpc", "profile_export_genai_perf.json"),
        ("aiperf", "FORGE_AIPERF", "triton-http", "profile_export_aiperf.json"),
    ],
)
def test_bench_tool_runs_genai_perf_and_aiperf_as_emitted_and_imports_their_export(
    timing_triton, tmp_path, monkeypatch, tool, env_var, target, export
):
    """`bench --tool` for the two tools installed in their own venvs: the executable from its environment variable,
    run in its log's folder with the same inputs and command line `--emit` writes (only the file places differ), its
    export found in its artifact folder and read into our summary; GenAI-Perf finds our perf_analyzer first on PATH."""
    import sys

    called = tmp_path / "called.json"
    stand_in = tmp_path / tool
    stand_in.write_text(_STAND_IN.format(python=sys.executable, tool=tool, called=str(called), export=export))
    stand_in.chmod(0o755)
    monkeypatch.setenv(env_var, str(stand_in))
    url = timing_triton.http_url if target == "triton-http" else timing_triton.grpc_url
    proc, doc = bench_run(url, target=target, concurrency=2, num_requests=6, input_len=5, output_len=4, tool=tool, out=tmp_path / "run")
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(called.read_text())
    work = tmp_path / "run" / tool.replace("-", "_")
    assert doc["source"] == tool and doc["tool_run"]["argv"] == [str(stand_in), *seen["argv"][1:]]
    assert seen["cwd"] == str(work) and doc["tool_run"]["log"] == str(work / f"{tool}.log")
    assert doc["tool_run"]["export"] == str(work / "artifacts") and doc["metrics"]["ttft_ms"]["p50"] == 40.5
    assert doc["requests"] == {"sent": 6, "completed": 6, "failed": 0, "errors_by_kind": {}}
    argv = seen["argv"]
    assert len((work / "prompts.jsonl").read_text().splitlines()) == 6 and argv[argv.index("--input-file") + 1] == str(
        work / "prompts.jsonl"
    )
    assert argv[argv.index("--concurrency") + 1] == "2" and argv[argv.index("--request-count") + 1] == "6"
    if tool == "genai-perf":
        assert argv[argv.index("--warmup-request-count") + 1] == "2" and "min_tokens:4" in argv  # 2 warm-up requests: one per slot
        if PA_PROBLEM is None:
            assert seen["path"].split(os.pathsep)[0] == str(Path(sys.prefix) / "bin")
    else:
        assert argv[argv.index("--url") + 1] == timing_triton.http_url
        assert '"min_tokens": {{ max_tokens }}' in (work / "prompts_payload.jinja").read_text()
