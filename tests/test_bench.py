"""`trtllm-forge bench`: statistics and metric definitions on hand-made records, then the real CLI against a
real tritonserver serving the timing model (known TTFT and token gap), and a minimal OpenAI-style server."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from aiohttp import web
from bench_helpers import GAP_MS, TTFT_MS, bench_json, bench_run, finish_bench, read_records, start_bench
from cli_inprocess import run_in_process

from trtllm_forge.bench.metrics import LATE_WARN_SHARE, STEAL_WARN_SHARE, summarize
from trtllm_forge.bench.records import RequestRecord
from trtllm_forge.bench.report import to_csv
from trtllm_forge.bench.runner import RunResult
from trtllm_forge.bench.schedule import arrival_offsets
from trtllm_forge.bench.specs import LengthSpec, LoadSpec
from trtllm_forge.bench.stats import describe
from trtllm_forge.errors import ConfigError

MS = 1_000_000


# ---- pure functions ------------------------------------------------------------------------------------


def test_describe_uses_linear_percentiles_and_keeps_mean_and_median_apart():
    stats = describe([1, 2, 3, 4, 100], "ms")
    assert stats["avg"] == pytest.approx(22.0)
    assert stats["p50"] == pytest.approx(3.0)
    assert stats["p90"] == pytest.approx(4 + 0.6 * 96)  # linear between the 4th and 5th values
    assert stats["min"] == 1 and stats["max"] == 100 and stats["count"] == 5
    assert describe([], "ms")["p50"] is None


def test_arrival_schedule_is_seeded_absolute_and_has_the_asked_rate():
    a = arrival_offsets(2000, 50.0, "poisson", np.random.default_rng(7))
    b = arrival_offsets(2000, 50.0, "poisson", np.random.default_rng(7))
    assert a == b and a[0] == 0.0 and all(y >= x for x, y in itertools.pairwise(a))
    assert 2000 / a[-1] == pytest.approx(50.0, rel=0.1)
    assert np.diff(arrival_offsets(10, 4.0, "constant", np.random.default_rng(0))) == pytest.approx([0.25] * 9)
    smooth = np.diff(arrival_offsets(2000, 50.0, "gamma", np.random.default_rng(1), burstiness=8.0))
    assert smooth.std() < np.diff(a).std() / 2  # higher gamma shape = smoother arrivals


def test_length_spec_parses_mean_std_and_ranges_and_rejects_nonsense():
    rng = np.random.default_rng(0)
    assert LengthSpec.parse("64", "--x").sample(3, rng) == [64, 64, 64]
    ranged = LengthSpec.parse("10..20", "--x").sample(500, rng)
    assert min(ranged) >= 10 and max(ranged) <= 20 and len(set(ranged)) > 5
    assert min(LengthSpec.parse("5:50", "--x").sample(500, rng)) >= 1
    with pytest.raises(ConfigError, match="--x"):
        LengthSpec.parse("ten", "--x")


def _record(i: int, sent: int, responses: list[tuple[int, int, bool]], requested: int) -> RequestRecord:
    r = RequestRecord(
        id=f"m{i}",
        phase="measure",
        intended_ns=sent,
        input_tokens=8,
        input_tokens_source="requested",
        requested_output_tokens=requested,
        sent_ns=sent,
    )
    for t, n, final in responses:
        r.recv_ns.append(t)
        r.tokens.append(n)
        r.empty.append(n == 0)
        r.final.append(final)
    return r


def test_metric_definitions_on_known_records():
    # An empty first response must not end TTFT; the flag-only final must not end E2E; a first response with
    # 3 tokens must come off TPOT's denominator.
    a = _record(0, 0, [(5 * MS, 0, False), (10 * MS, 3, False), (20 * MS, 1, False), (30 * MS, 1, False), (31 * MS, 0, True)], 5)
    b = _record(1, 0, [(12 * MS, 1, False), (14 * MS, 1, False), (15 * MS, 0, True)], 2)
    failed = _record(2, 0, [], 4)
    failed.error_kind, failed.error_message = "connection", "gone"
    result = RunResult(LoadSpec("concurrency", 2, num_requests=3), [a, b, failed], 0, 40 * MS, 0, 0.001)
    s = summarize(result, slo={"ttft": 11.0})
    m = s["metrics"]
    assert sorted([m["ttft_ms"]["min"], m["ttft_ms"]["max"]]) == [10.0, 12.0]
    assert m["e2e_ms"]["max"] == 30.0 and m["e2e_ms"]["min"] == 14.0
    assert m["tpot_ms"]["min"] == pytest.approx(2.0) and m["tpot_ms"]["max"] == pytest.approx(10.0)  # b: 2/1; a: 20/2
    assert sorted([m["itl_ms"]["min"], m["itl_ms"]["max"]]) == [2.0, 10.0] and m["itl_ms"]["count"] == 3
    assert m["itl_per_token_ms"]["count"] == 3 and m["itl_per_token_ms"]["max"] == 10.0
    assert m["time_to_first_response_ms"]["min"] == 5.0
    assert s["requests"] == {
        "sent": 3,
        "completed": 2,
        "failed": 1,
        "errors_by_kind": {"connection": 1},
        "warmup": 0,
        "retried": 0,
        "retries": 0,
    }
    assert s["windows"]["benchmark"]["seconds"] == pytest.approx(0.030)
    assert m["output_token_throughput_per_s"]["avg"] == pytest.approx(7 / 0.030)
    assert m["goodput_per_s"]["avg"] == pytest.approx(1 / 0.030)  # only a meets TTFT <= 11 ms
    assert s["self_checks"]["empty_responses"] == 3
    csv = to_csv(s).splitlines()
    assert csv[0] == "Metric,avg,min,max,p99,p95,p90,p75,p50,p25,p10,p5,p1"
    assert "" in csv and "Metric,Value" in csv


# ---- against real servers ------------------------------------------------------------------------------


def start_openai_server(ttft_ms: float = 15.0, gap_ms: float = 5.0) -> tuple[str, callable]:
    """A minimal OpenAI-compatible server on 127.0.0.1 (a thread in the test process): /v1/models,
    /v1/completions and /v1/chat/completions streaming one word per chunk on a fixed schedule, then a
    usage chunk and [DONE]. Returns (base url, stop)."""

    async def models(_request):
        return web.json_response({"data": [{"id": "timing"}]})

    async def complete(request):
        body = await request.json()
        chat = request.path.endswith("/chat/completions")
        n = int(body.get("max_tokens", 16))
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        start = time.monotonic()
        for k in range(n):
            await asyncio.sleep(max(0.0, start + (ttft_ms + k * gap_ms) / 1e3 - time.monotonic()))
            choice = {"index": 0, "delta": {"content": " tok"}} if chat else {"index": 0, "text": " tok"}
            await response.write(f"data: {json.dumps({'choices': [choice]})}\n\n".encode())
        await response.write(f"data: {json.dumps({'choices': [], 'usage': {'completion_tokens': n}})}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/completions", complete)
    app.router.add_post("/v1/chat/completions", complete)
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = site._server.sockets[0].getsockname()[1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    def stop():
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)

    return f"http://127.0.0.1:{port}", stop


def assert_reports_its_records(doc: dict, directory: Path) -> list[dict]:
    """The timings a bench document reports are the ones its own records (requests.jsonl) hold.

    This is what the bench is responsible for, whatever the machine's punctuality: on a busy machine the
    schedule slips and latencies grow, and the document must say so exactly. Timing goals live in benchmarks."""
    measured = [r for r in read_records(directory) if r["phase"] == "measure"]
    done = [r for r in measured if r["error"] is None and any(x["tokens"] for x in r["responses"])]
    assert doc["requests"]["sent"] == len(measured) and doc["requests"]["completed"] == len(done)
    ttft, e2e, itl = [], [], []
    for r in done:
        stamps = [x["recv_ns"] for x in r["responses"] if x["tokens"] > 0]
        ttft.append((stamps[0] - r["sent_ns"]) / 1e6)
        e2e.append((stamps[-1] - r["sent_ns"]) / 1e6)
        itl.extend(np.diff(stamps) / 1e6)
    m = doc["metrics"]
    for name, values in (("ttft_ms", ttft), ("e2e_ms", e2e), ("itl_ms", itl)):
        if values:
            assert m[name]["p50"] == pytest.approx(float(np.percentile(values, 50)), rel=1e-9, abs=1e-9), name
    late = [r["sent_ns"] - r["intended_ns"] > doc["self_checks"]["late_threshold_ms"] * 1e6 for r in measured]
    assert doc["self_checks"]["late_share"] == pytest.approx(sum(late) / len(measured))
    warned = any("after their schedule" in w for w in doc["warnings"])
    assert warned == (doc["load"]["mode"] == "rate" and doc["self_checks"]["late_share"] > LATE_WARN_SHARE)
    steal = doc["self_checks"]["steal_share"]  # this machine's /proc/stat, over the run
    assert 0.0 <= steal <= 1.0
    assert any("hypervisor" in w for w in doc["warnings"]) == (steal > STEAL_WARN_SHARE)
    return measured


@pytest.mark.slow
def test_grpc_closed_loop_sweep_measures_the_known_schedule(timing_triton, tmp_path):
    proc, doc = bench_run(
        timing_triton.grpc_url,
        target="triton-grpc",
        concurrency="1,8",
        num_requests=16,
        input_len=16,
        output_len=12,
        out=tmp_path,
        extra=("--metrics-url", timing_triton.metrics_url),
        plots=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert [p["load"]["value"] for p in doc["points"]] == [1, 8]
    for point in doc["points"]:
        m = point["metrics"]
        assert point["requests"]["completed"] == 16 and point["requests"]["failed"] == 0
        assert_reports_its_records(point, tmp_path / f"c{point['load']['value']}")
        # Lower bounds only: the server never answers before its schedule; a busy machine only adds to it.
        assert m["ttft_ms"]["p50"] >= TTFT_MS
        assert m["e2e_ms"]["p50"] >= TTFT_MS + 11 * GAP_MS
        assert m["output_tokens"]["min"] == 12 and point["self_checks"]["osl_mismatch_count"] == 0
        assert point["target"]["output_tokens_source"] == "server_count"
        assert point["target"]["forced_output_len"].startswith("min_tokens=max_tokens")
        assert point["self_checks"]["empty_responses"] == 16  # one flag-only final per request, counted, not timed
        for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms", "output_token_throughput_per_s", "request_throughput_per_s"):
            assert set(m[key]) >= {"avg", "p50", "p90", "p95", "p99"}
        assert point["server_metrics"]["models"]["ensemble"]["requests"] >= 16
        # return_perf_metrics: the server waited at least its TTFT; the client's TTFT contains the server's
        assert m["server_ttft_ms"]["p50"] >= TTFT_MS - 1
        assert m["client_minus_server_ttft_ms"]["p50"] >= 0
    # Requests overlapped at concurrency 8 (never more than 8 in flight): a property of the load, not of speed.
    assert 1 < doc["points"][1]["metrics"]["achieved_concurrency"]["avg"] <= 8
    records = read_records(tmp_path / "c8")
    assert len(records) == 18  # 16 measured + 2 warm-up
    record = records[-1]
    assert record["responses"][-1]["final"] and record["responses"][-1]["empty"]
    assert (tmp_path / "c1" / "summary.csv").read_text().startswith("Metric,avg,min,max,p99")
    assert "ttft_ms" in proc.stderr and "sweep" in proc.stderr  # the console table
    for png in (tmp_path / "latency_throughput.png", tmp_path / "c8" / "latency_cdf.png", tmp_path / "c8" / "tokens_over_time.png"):
        assert png.stat().st_size > 1000, png


@pytest.mark.slow
def test_grpc_open_loop_poisson_with_duration_and_tokens_target(timing_triton, tmp_path):
    proc, doc = bench_run(
        timing_triton.grpc_url,
        num_requests=10,
        output_len=8,
        out=tmp_path / "rate",
        extra=("--request-rate", "40", "--arrival", "poisson", "--duration", "1.5", "--seed", "0"),
        plots=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert doc["load"]["mode"] == "rate" and doc["load"]["arrival"] == "poisson"
    measured = assert_reports_its_records(doc, tmp_path / "rate")
    # The requests went out on the seeded Poisson schedule (~40/s), each due within the 1.5 s; how late each
    # actually left is the machine's business, reported as late_share (checked against the records above).
    start = min(r["intended_ns"] for r in measured)
    offsets = sorted((r["intended_ns"] - start) / 1e9 for r in measured)
    expected = arrival_offsets(1000, 40.0, "poisson", np.random.default_rng([0, 40_000]))
    assert offsets == pytest.approx(expected[: len(offsets)], abs=1e-6)
    assert 1 <= len(offsets) <= sum(1 for x in expected if x < 1.5) and max(offsets) < 1.5
    assert sum(1 for x in expected if x < 1.5) >= 30  # the schedule itself: ~60 arrivals in 1.5 s at 40/s
    assert doc["metrics"]["ttft_from_intended_ms"]["p50"] >= doc["metrics"]["ttft_ms"]["p50"]

    proc, doc = bench_run(
        timing_triton.grpc_url, concurrency=4, num_requests=8, output_len=6, out=tmp_path / "sharded", extra=("--workers", "2")
    )
    assert proc.returncode == 0, proc.stderr
    assert doc["requests"]["completed"] == 8
    assert_reports_its_records(doc, tmp_path / "sharded")
    workers = {r["worker"] for r in read_records(tmp_path / "sharded")}
    assert workers == {0, 1}

    dataset = tmp_path / "ids.jsonl"
    dataset.write_text("".join(json.dumps({"input_ids": list(range(1, 1 + n)), "output_tokens": 6}) + "\n" for n in (4, 9, 17)))
    proc, doc = bench_run(
        timing_triton.grpc_url,
        target="triton-grpc-tokens",
        model="tensorrt_llm",
        concurrency=2,
        num_requests=6,
        out=tmp_path / "tok",
        extra=("--dataset", str(dataset)),
    )
    assert proc.returncode == 0, proc.stderr
    assert doc["requests"]["completed"] == 6 and doc["target"]["output_tokens_source"] == "server_ids"
    assert doc["metrics"]["output_tokens"]["min"] == 6 and doc["metrics"]["input_tokens"]["max"] == 17
    assert_reports_its_records(doc, tmp_path / "tok")


@pytest.mark.slow
def test_http_targets_triton_generate_stream_and_openai(timing_triton, tmp_path):
    proc, doc = bench_run(
        timing_triton.http_url,
        target="triton-http",
        num_requests=20,
        output_len=10,
        out=tmp_path / "http",
        extra=("--request-rate", "30", "--arrival", "constant"),
        plots=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert doc["requests"]["completed"] == 20 and doc["metrics"]["output_tokens"]["min"] == 10, proc.stderr[-1500:]
    assert_reports_its_records(doc, tmp_path / "http")

    url, stop = start_openai_server(ttft_ms=15.0, gap_ms=5.0)
    try:
        for endpoint in ("completions", "chat"):
            proc, doc = bench_run(
                url,
                target="openai",
                model="timing",
                concurrency=4,
                num_requests=8,
                output_len=6,
                out=tmp_path / endpoint,
                extra=("--openai-endpoint", endpoint),
            )
            assert proc.returncode == 0, proc.stderr
            assert doc["requests"]["completed"] == 8, proc.stderr[-1500:]
            assert_reports_its_records(doc, tmp_path / endpoint)
            assert doc["metrics"]["ttft_ms"]["p50"] >= 15.0  # the server's first chunk is never early
            assert doc["metrics"]["output_tokens"]["max"] == 6 and doc["self_checks"]["osl_mismatch_count"] == 0
    finally:
        stop()


@pytest.mark.slow
def test_bench_config_uses_the_deployment_and_compare_lists_runs(timing_triton, tmp_path):
    """`bench CONFIG` against a deployment made by trtllm_forge.deploy (serving the timing model)."""
    from bench_support.local_triton import render_timing_model

    from trtllm_forge.config import load_config
    from trtllm_forge.deploy.server import start_server, stop_server

    config_path = tmp_path / "b.yaml"
    base = yaml.safe_load((Path(__file__).resolve().parent.parent / "configs" / "smollm2-cpu.yaml").read_text())
    base["bench"] = {
        "workloads": [
            {"name": "tiny", "concurrency": [2], "num_requests": 6, "input_len": 8, "output_len": "4..6", "slo_ms": {"ttft": 1000}},
            {"name": "paced", "request_rate": [20], "arrival": "constant", "num_requests": 6, "output_len": 4},
        ]
    }
    config_path.write_text(yaml.safe_dump(base, sort_keys=False))
    wd = tmp_path / "wd"
    render_timing_model(tmp_path / "repo", "ensemble", ttft_ms=TTFT_MS, gap_ms=GAP_MS)
    start_server(load_config(config_path), wd, tmp_path / "repo")
    try:
        proc, doc = bench_json(str(config_path), "--workdir", str(wd), "--no-plots")
    finally:
        stop_server(wd, quiet=True)
    assert proc.returncode == 0, proc.stderr
    tiny, paced = doc["workloads"]
    assert tiny["requests"]["completed"] == 6 and 4 <= tiny["metrics"]["output_tokens"]["min"] <= 6
    assert tiny["metrics"]["goodput_per_s"]["avg"] > 0 and tiny["load"]["mode"] == "concurrency"
    assert paced["load"] == {**paced["load"], "mode": "rate", "value": 20.0, "arrival": "constant"}
    assert tiny["server_metrics"]["models"]["ensemble"]["requests"] >= 6  # scraped from the deployment's metrics URL
    assert (wd / "bench" / "tiny" / "summary.json").is_file() and (wd / "bench" / "paced" / "requests.jsonl").is_file()
    proc2, _ = bench_run(timing_triton.grpc_url, num_requests=4, output_len=4, out=tmp_path / "other")
    assert proc2.returncode == 0, proc2.stderr
    proc, doc = bench_json("compare", str(wd / "bench" / "tiny"), str(tmp_path / "other"), "--out", str(tmp_path / "cmp"), in_process=True)
    assert proc.returncode == 0, proc.stderr
    assert len(doc["runs"]) == 2 and doc["runs"][0]["ttft_ms_p50"] > 0
    assert (tmp_path / "cmp" / "compare.csv").is_file()


@pytest.mark.slow
def test_killing_the_server_mid_run_keeps_records_and_exits_1(tmp_path):
    from bench_support.local_triton import render_timing_model, start_triton

    render_timing_model(tmp_path / "repo", "ensemble", ttft_ms=10.0, gap_ms=20.0)
    server = start_triton(tmp_path / "repo", tmp_path)
    out = tmp_path / "out"
    try:
        bench, started = start_bench(server.grpc_url, concurrency=4, num_requests=40, output_len=20, warmup=0, out=out)
        time.sleep(2.0)  # ~0.4 s per request: several complete, then the server dies under load
        os.killpg(server.process.pid, signal.SIGKILL)
        stdout, stderr = finish_bench(bench, started)
    finally:
        server.stop()
    assert bench.returncode == 1, stderr
    error_lines = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(error_lines) == 1 and "requests failed" in error_lines[0] and "connection" in error_lines[0]
    summary = json.loads(stdout)
    assert summary["requests"]["completed"] >= 1 and summary["requests"]["failed"] >= 1
    assert summary["requests"]["errors_by_kind"].get("connection", 0) >= 1
    assert json.loads((out / "summary.json").read_text())["requests"] == summary["requests"]
    records = read_records(out)
    assert len(records) == summary["requests"]["sent"]
    assert any(r["error"] and r["error"]["kind"] == "connection" for r in records)


def test_emit_writes_inputs_and_commands_and_import_feeds_compare(tmp_path):
    proc = run_in_process(
        "bench",
        "--url",
        "127.0.0.1:9",
        "--model",
        "ensemble",
        "--concurrency",
        "4",
        "--num-requests",
        "4",
        "--input-len",
        "5",
        "--output-len",
        "7",
        "--emit",
        "perf_analyzer",
        "--emit",
        "genai-perf",
        "--emit",
        "aiperf",
        "--out",
        str(tmp_path / "w"),
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    emitted = {e["tool"]: e for e in json.loads(proc.stdout)["emitted"]}
    pa = json.loads((tmp_path / "w" / "emit" / "perf_analyzer_inputs.json").read_text())["data"]
    assert len(pa) == 4 and pa[0]["max_tokens"]["content"] == [7] and len(pa[0]["text_input"]["content"][0].split()) == 5
    assert pa[0]["min_tokens"]["content"] == [7] and "min_length" not in pa[0]  # the ensemble declares min_tokens
    assert "--concurrency-range 4" in emitted["perf_analyzer"]["commands"][0]
    assert "--output-tokens-mean 7" in emitted["genai-perf"]["commands"][0] and "min_tokens:7" in emitted["genai-perf"]["commands"][0]
    assert "--endpoint-type kserve" in emitted["genai-perf"]["commands"][0] and "--service-kind" not in emitted["genai-perf"]["commands"][0]
    assert "/v2/models/ensemble/generate_stream" in emitted["aiperf"]["commands"][0]
    assert len((tmp_path / "w" / "emit" / "aiperf_inputs.jsonl").read_text().splitlines()) == 4

    # Exports in the documented shapes of GenAI-Perf (CSV) and AIPerf (per-request JSONL).
    gp = tmp_path / "gp" / "profile_export_genai_perf.csv"
    gp.parent.mkdir()
    gp.write_text(
        "Metric,avg,min,max,p99,p95,p90,p75,p50,p25,p10,p5,p1\n"
        "Time To First Token (ms),30.00,20.00,40.00,39.00,38.00,37.00,35.00,31.00,25.00,22.00,21.00,20.00\n"
        "Inter Token Latency (ms),5.00,4.00,6.00,6.00,6.00,6.00,5.50,5.00,4.50,4.20,4.10,4.00\n"
        "Request Latency (ms),200.00,150.00,250.00,249.00,245.00,240.00,220.00,201.00,180.00,160.00,155.00,151.00\n"
        "\nMetric,Value\nOutput Token Throughput (tokens/sec),1234.5\nRequest Throughput (per sec),12.5\nRequest Count (count),40\n"
    )
    ai = tmp_path / "ai" / "profile_export.jsonl"
    ai.parent.mkdir()
    ai.write_text(
        "".join(
            json.dumps(
                {
                    "metadata": {"request_start_ns": i * 10**8, "request_end_ns": i * 10**8 + 2 * 10**8, "benchmark_phase": "profiling"},
                    "metrics": {
                        "time_to_first_token": {"value": 10.0 + i, "unit": "ms"},
                        "request_latency": {"value": 200.0, "unit": "ms"},
                        "inter_chunk_latency": {"value": [5.0, 5.0, 6.0], "unit": "ms"},
                        "output_sequence_length": {"value": 4, "unit": "tokens"},
                    },
                    "error": None,
                }
            )
            + "\n"
            for i in range(5)
        )
    )
    proc = run_in_process("bench", "import", str(gp), str(ai.parent), "--out", str(tmp_path / "imp"), "--json")
    assert proc.returncode == 0, proc.stderr
    runs = json.loads(proc.stdout)["runs"]
    imported = json.loads((Path(runs[0]) / "summary.json").read_text())
    assert imported["source"] == "genai-perf" and imported["metrics"]["ttft_ms"]["p50"] == 31.0
    assert imported["metrics"]["tpot_ms"]["avg"] == 5.0  # GenAI-Perf's ITL is a per-request decode average
    assert imported["metrics"]["output_token_throughput_per_s"]["avg"] == 1234.5
    aiperf = json.loads((Path(runs[1]) / "summary.json").read_text())
    assert aiperf["metrics"]["ttft_ms"]["p50"] == 12.0 and aiperf["metrics"]["itl_ms"]["count"] == 15
    assert aiperf["metrics"]["request_throughput_per_s"]["avg"] == pytest.approx(5 / 0.6)
    proc = run_in_process("bench", "compare", *runs, "--out", str(tmp_path / "cmp"), "--json")
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)["runs"]
    assert [r["source"] for r in rows] == ["genai-perf", "aiperf"] and rows[0]["ttft_ms_p50"] == 31.0
    assert (tmp_path / "cmp" / "pareto.png").stat().st_size > 1000


def test_bench_usage_errors_are_one_line_exit_2(tmp_path):
    for args, where in (
        (["--concurrency", "0", "--url", "x:1", "--model", "m"], "--concurrency"),
        (["--input-len", "abc", "--url", "x:1", "--model", "m"], "--input-len"),
        (["--slo", "latency:5", "--url", "x:1", "--model", "m"], "--slo"),
        (["--concurrency", "2"], "--url"),
    ):
        proc = run_in_process("bench", *args)
        assert proc.returncode == 2, (args, proc.stderr)
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and where in lines[0], proc.stderr
    proc = run_in_process(
        "bench",
        "--url",
        "127.0.0.1:1",
        "--model",
        "ensemble",
        "--concurrency",
        "1,4",
        "--dry-run",
        "--json",
        "--out",
        str(tmp_path / "dry"),
    )
    assert proc.returncode == 0 and json.loads(proc.stdout)["runs"][0]["points"] == ["c1", "c4"]
    assert not (tmp_path / "dry").exists()  # nothing sent, nothing written
    proc = run_in_process("bench", "--url", "127.0.0.1:1", "--model", "ensemble", "--num-requests", "1")
    assert proc.returncode == 1 and proc.stderr.strip().splitlines()[-1].startswith("error: --url: cannot read model")


def test_synthetic_prompts_reencode_to_the_exact_length(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from trtllm_forge.bench.workload import load_tokenizer, synthetic

    vocab = {"[UNK]": 0, **{f"w{i}": i + 1 for i in range(500)}}
    raw = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="[UNK]").save_pretrained(tmp_path / "tok")
    tokenizer = load_tokenizer(tmp_path / "tok")
    requests = synthetic(20, LengthSpec.parse("10..40", "--input-len"), LengthSpec(8), np.random.default_rng(3), tokenizer)
    for r in requests:
        assert r.input_tokens_source == "client_tokenizer"
        assert len(tokenizer.encode(r.prompt, add_special_tokens=False)) == r.input_tokens == len(r.input_ids)
        assert 10 <= r.input_tokens <= 40
    again = synthetic(20, LengthSpec.parse("10..40", "--input-len"), LengthSpec(8), np.random.default_rng(3), tokenizer)
    assert [r.prompt for r in again] == [r.prompt for r in requests]  # seeded


def test_bench_tokenizer_is_the_served_loader_and_counts_like_transformers(smollm2_checkpoint, reference_model):
    """With a tokenizer.json the bench loads the tokenizer as the served preprocessing does (the `tokenizers`
    library, no transformers import: ~7 s per bench process here) and counts, decodes and excludes special tokens
    exactly as transformers' AutoTokenizer."""
    import sys

    from trtllm_forge.bench.workload import load_tokenizer

    ours, theirs = load_tokenizer(smollm2_checkpoint), reference_model.tokenizer
    assert type(ours).__name__ == "FastTokenizer"
    assert len(ours) == len(theirs) and ours.all_special_ids == sorted(theirs.all_special_ids)
    texts = [
        "The capital of France is",
        "  leading spaces, émigré — ünïcödé 😀",
        "def fibonacci(n):\n    return n",
        "<|im_start|>user hi<|im_end|>",
    ]
    for text in texts:
        ids = ours.encode(text, add_special_tokens=False)
        assert ids == theirs.encode(text, add_special_tokens=False), text
        for skip in (True, False):
            assert ours.decode(ids, skip_special_tokens=skip) == theirs.decode(ids, skip_special_tokens=skip), (text, skip)

    code = f"import sys; from trtllm_forge.bench.workload import load_tokenizer; load_tokenizer({str(smollm2_checkpoint)!r}); print('transformers' in sys.modules)"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert loaded.stdout.strip() == "False", loaded.stderr


def test_running_total_token_counts_become_per_response_counts():
    from trtllm_forge.bench.target import cumulative_to_deltas

    running = _record(0, 0, [(1, 1, False), (2, 2, False), (3, 3, False), (4, 0, True)], 3)
    running.output_tokens_source = "server_count"
    cumulative_to_deltas(running)
    assert running.tokens == [1, 1, 1, 0] and running.output_tokens == 3
    assert running.output_tokens_source == "server_count_cumulative"
    per_response = _record(1, 0, [(1, 1, False), (2, 1, False), (3, 0, True)], 2)
    cumulative_to_deltas(per_response)
    assert per_response.tokens == [1, 1, 0]


@pytest.mark.slow
def test_a_silent_server_and_sigterm_end_the_run_with_records_and_exit_1(timing_triton, tmp_path):
    proc, doc = bench_run(
        timing_triton.grpc_url,
        model="silent",
        concurrency=3,
        num_requests=9,
        warmup=0,
        out=tmp_path / "stall",
        extra=("--stall-timeout", "1"),
    )
    assert proc.returncode == 1 and proc.stderr.strip().splitlines()[-1].startswith("error: bench: 3 of 3 requests failed (stalled: 3)")
    assert doc["requests"]["errors_by_kind"] == {"stalled": 3} and any("no response" in w for w in doc["warnings"])
    assert any("cannot check whether an engine stub died" in w for w in doc["warnings"])  # a bare --url names no deployment
    assert len(read_records(tmp_path / "stall")) == 3

    bench, started = start_bench(
        timing_triton.grpc_url, num_requests=200, warmup=0, out=tmp_path / "term", extra=("--request-rate", "10", "--arrival", "constant")
    )
    time.sleep(1.5)
    bench.send_signal(signal.SIGTERM)
    stdout, stderr = finish_bench(bench, started)
    assert bench.returncode == 1, stderr
    summary = json.loads(stdout)
    assert 5 <= summary["requests"]["sent"] < 200 and summary["requests"]["completed"] >= 5
    assert set(summary["requests"]["errors_by_kind"]) <= {"interrupted"} and summary["aborted"] == "interrupted by SIGTERM"
    assert any("interrupted by SIGTERM" in w for w in summary["warnings"])


def test_a_full_disk_keeps_what_was_measured_and_names_the_path(full_disk):
    """Issue #35.3: the summaries are printed (and in --json) before anything is written; a write that fails is one
    error line naming the path (exit 1, not 'internal'), the sweep goes on, and no partial temp file is left."""
    url, stop = start_openai_server(ttft_ms=5.0, gap_ms=1.0)
    try:
        proc, doc = bench_run(url, target="openai", model="timing", concurrency="1,2", num_requests=6, output_len=4, out=full_disk / "run")
    finally:
        stop()
    assert proc.returncode == 1, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "internal" not in errors[0], proc.stderr[-2000:]
    assert errors[0].startswith(f"error: bench --out: could not write {full_disk}/run") and "No space left on device" in errors[0]
    assert doc is not None and [p["requests"]["completed"] for p in doc["points"]] == [6, 6]  # both points measured, shown
    assert doc["not_written"]["path"].startswith(str(full_disk))
    assert not [p for p in full_disk.rglob("*") if p.name.endswith(".tmp")], sorted(map(str, full_disk.rglob("*")))


@pytest.mark.slow
def test_a_dead_engine_stub_ends_the_point_at_once(triton_for_test, tmp_path):
    """Issue #35.6: Triton 2.51 never errors the streams of a python stub that died (and keeps saying ready), so the
    bench of a deployment it found in the workdir asks the stubs when a stall starts and ends the point at once."""
    from bench_helpers import wait_for_point
    from bench_support.local_triton import render_timing_model
    from conftest import forge_test_config

    from trtllm_forge.deploy.health import stub_pids

    render_timing_model(tmp_path / "repo", "ensemble", ttft_ms=20.0, gap_ms=50.0)  # 500 tokens: 25 s per request
    config = forge_test_config()
    deployment = triton_for_test(tmp_path / "repo", config=config, workdir=tmp_path / "wd")
    config_file = tmp_path / "deploy-test.yaml"
    config_file.write_text(yaml.safe_dump(config.model_dump(mode="json", exclude_unset=True)))
    argv = ["--workdir", str(tmp_path / "wd"), "--model", "ensemble", "--concurrency", "8", "--num-requests", "16", "--warmup", "0"]
    argv += ["--output-len", "500", "--out", str(tmp_path / "out"), "--no-plots", "--json"]
    bench = subprocess.Popen(
        [sys.executable, "-m", "trtllm_forge", "bench", str(config_file), *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    started = wait_for_point(bench)
    time.sleep(1.0)
    (stub,) = stub_pids(deployment.pgid)[0]["ensemble"]
    os.kill(stub, signal.SIGKILL)
    killed = time.monotonic()
    stdout, stderr = finish_bench(bench, started, timeout=50)  # the stall timeout is 60 s
    assert time.monotonic() - killed < 20, stderr[-2000:]
    assert bench.returncode == 1, stderr[-2000:]
    summary = json.loads(stdout)
    assert summary["aborted"].startswith("engine stub died (model ensemble: 1 of 1 python stub process(es) not running"), summary["aborted"]
    assert summary["requests"]["errors_by_kind"] == {"stub_died": 8}, summary["requests"]
