#!/usr/bin/env python3
"""Who measures right? trtllm-forge bench, perf_analyzer, GenAI-Perf and AIPerf on the same servers, interleaved.

For each repeat and each concurrency, back to back and in rotated order, runs our bench, perf_analyzer 2.51
(`bench --tool perf_analyzer`), GenAI-Perf 0.0.16 (when FORGE_GENAI_PERF points at it and --tokenizer is given)
and AIPerf 0.13 (when FORGE_AIPERF points at it) with the same workload, each in its own process, against:

- the timing model at concurrency 1, 4, 16, 64 (a Triton python-backend model with the ensemble's text contract and a known schedule:
  first token TTFT ms after the request reaches the model, then one every GAP ms; every response carries
  the model's own send stamp, and with return_perf_metrics its arrival and first-token stamps);
- the flood model (the timing model sending 256 tokens back to back): who keeps up with a response flood
  (our bench and perf_analyzer; GenAI-Perf is perf_analyzer underneath; AIPerf is left out to keep the run short);
- the CPU deployment (`--cpu-url`: a running `trtllm-forge deploy` of configs/smollm2-cpu.yaml), where there
  is no truth and the tools are compared with each other (AIPerf only with `--cpu-http-url`).

GenAI-Perf and AIPerf run the way a user meets them (issue 15.2): the command `trtllm-forge bench --emit TOOL`
prints, run as printed (only `genai-perf` / `aiperf` replaced by the configured executable), its export read by
`trtllm-forge bench import`; each row keeps the emitted command. GenAI-Perf counts output tokens with the
tokenizer (TPOT = (E2E − TTFT) / (tokens − 1)), so --tokenizer must count one token per timing-model response
(" tok"): the imported SmolLM2 checkpoint does; the script refuses one that does not.

Truth on the timing model: the configured TTFT and gap (the server can only be late); E2E = TTFT + (OSL − 1)
× gap. Because the python backend on a busy machine is late by itself, each run is also checked against the
server's stamps, which every tool records (ours in requests.jsonl, perf_analyzer's raw export keeps the
response outputs): reference TTFT = the model's first send stamp − the tool's send stamp (an ideal client
with zero delivery delay), and the delivery lag = each response's receive stamp − its send stamp. The
server's stamps are CLOCK_MONOTONIC (ours too); perf_analyzer stamps with the wall clock, converted with
the offset between the two clocks read around each run.

Writes results/bench_fidelity/tools.json (git commit, machine, load average, every run); `readme_table()`
renders the README block between the `bench-fidelity-table` markers from that file (--readme / --readme-only).

    .venv/bin/python scripts/bench_tools_fidelity.py [--repeats 3] [--concurrency 1,4,16,64] [--tools trtllm-forge,perf_analyzer] [--tokenizer DIR]
        [--cpu-url HOST:PORT] [--readme]
    .venv/bin/python scripts/bench_tools_fidelity.py --readme-only   # the README block from the committed file
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtllm_forge.bench.metrics import STEAL_WARN_SHARE
from trtllm_forge.bench.provenance import git_commit, machine, machine_cpu_ticks, measured_where, steal_share
from trtllm_forge.processes import cpu_seconds

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "results" / "bench_fidelity" / "tools.json"
README = REPO / "docs" / "benchmarks" / "bench-fidelity.md"  # the page holding the block (scripts/readme_tables.py regenerates all)
MARKERS = ("<!-- bench-fidelity-table:start -->", "<!-- bench-fidelity-table:end -->")
TTFT_MS, GAP_MS, OSL, ISL = 40.0, 10.0, 16, 32
FLOOD_OSL, FLOOD_INSTANCES = 256, 2
# Requests per flood run at least: with 8 (2,048 responses, ~1.3 s at concurrency 1) single runs of one client were
# 1,033-1,871 responses/s apart on 2026-12-03; 32 measure for a few seconds.
FLOOD_MIN_REQUESTS = 32
# A run during which the hypervisor took more of the machine's CPU time (steal) than the share bench warns about
# (metrics.STEAL_WARN_SHARE) is kept in the file but left out of every comparison and run again, at most STEAL_RERUNS
# times (the last attempt counts whatever its steal). On 2026-12-03 steal came in bursts of 10-30% lasting ~10 s;
# flood runs in one were 20-40% slower than runs of the same client beside them at ~0%, more than any difference
# between the clients.
STEAL_RERUNS = 2
METRICS = (("ttft_ms", "p50"), ("tpot_ms", "p50"), ("itl_ms", "p50"), ("e2e_ms", "p50"))
TOOLS = ("trtllm-forge", "perf_analyzer", "genai-perf", "aiperf")
EMITTED = ("genai-perf", "aiperf")  # run as `bench --emit` prints them, read by `bench import`
TOOL_ENV = {"genai-perf": "FORGE_GENAI_PERF", "aiperf": "FORGE_AIPERF"}

Row = dict[str, Any]


def wall_minus_monotonic_ns() -> int:
    """CLOCK_REALTIME − CLOCK_MONOTONIC, from the tightest of a few bracketed reads."""
    best: tuple[int, int] | None = None
    for _ in range(200):
        before = time.monotonic_ns()
        wall = time.time_ns()
        after = time.monotonic_ns()
        if best is None or after - before < best[0]:
            best = (after - before, wall - (before + after) // 2)
    assert best is not None
    return best[1]


@dataclass
class Stamps:
    """One request's stamps on the server's clock (CLOCK_MONOTONIC): the tool's send and receive stamps of the
    token-carrying responses, and the model's send stamps, arrival and first-token stamps."""

    sent_ns: int
    recv_ns: list[int]
    server_ns: list[int]
    arrival_ns: int | None


def forge_stamps(point_dir: Path) -> list[Stamps]:
    from trtllm_forge.bench.records import read_jsonl

    out = []
    for record in read_jsonl(point_dir / "requests.jsonl"):
        if record.phase != "measure" or not record.ok:
            continue
        recv = [t for t, k in zip(record.recv_ns, record.tokens, strict=False) if k > 0]
        arrival = (record.server_perf or {}).get("arrival_time_ns")
        out.append(Stamps(record.sent_ns, recv, list(record.server_send_ns), arrival))
    return out


def pa_export_stamps(export: Path, offset_ns: int) -> list[Stamps]:
    """perf_analyzer's raw export (its wall-clock stamps moved to CLOCK_MONOTONIC with `offset_ns`)."""
    data = json.loads(export.read_text())
    out = []
    for experiment in data["experiments"]:
        for request in experiment.get("requests") or []:
            recv, server, arrival = [], [], None
            for stamp, output in zip(request.get("response_timestamps") or [], request.get("response_outputs") or [], strict=False):
                if not (output or {}).get("text_output") or "send_time_ns" not in output:
                    continue  # the null final response
                recv.append(int(stamp) - offset_ns)
                server.append(int(output["send_time_ns"]))
                arrival = arrival or output.get("arrival_time_ns")
            sent = int(request["timestamp"]) - offset_ns
            if arrival is not None and not (sent - 1_000_000_000 < arrival <= (server or [0])[0]):
                arrival = None  # an output the request did not ask for (GenAI-Perf): perf_analyzer exports a stale buffer
            out.append(Stamps(sent, recv, server, arrival))
    return out


def stamp_stats(requests: list[Stamps]) -> dict[str, float | None]:
    """Reference TTFT (model's first send − tool's send), request path (model's arrival − tool's send), delivery
    lag (tool's receive − model's send, every response), responses consumed per second, zero gaps."""
    usable = [r for r in requests if r.recv_ns and len(r.recv_ns) == len(r.server_ns)]
    if not usable:
        return {}
    lags = sorted((a - b) / 1e6 for r in usable for a, b in zip(r.recv_ns, r.server_ns, strict=False))
    first_lags = [(r.recv_ns[0] - r.server_ns[0]) / 1e6 for r in usable]
    gaps = [b - a for r in usable for a, b in zip(r.recv_ns, r.recv_ns[1:], strict=False)]
    paths = [(r.arrival_ns - r.sent_ns) / 1e6 for r in usable if r.arrival_ns]
    server_ttft = [(r.server_ns[0] - r.arrival_ns) / 1e6 for r in usable if r.arrival_ns]
    window = measured_window(usable)
    assert window is not None  # every usable request has responses
    span_s = (window[1] - window[0]) / 1e9
    return {
        "ref_ttft_ms_p50": statistics.median((r.server_ns[0] - r.sent_ns) / 1e6 for r in usable),
        "ref_e2e_ms_p50": statistics.median((r.server_ns[-1] - r.sent_ns) / 1e6 for r in usable),
        "ref_tpot_ms_p50": statistics.median(
            (r.server_ns[-1] - r.server_ns[0]) / 1e6 / (len(r.server_ns) - 1) for r in usable if len(r.server_ns) > 1
        )
        if any(len(r.server_ns) > 1 for r in usable)
        else None,
        "server_ttft_ms_p50": statistics.median(server_ttft) if server_ttft else None,
        "request_path_ms_p50": statistics.median(paths) if paths else None,
        "delivery_lag_ms_p50": lags[len(lags) // 2],
        "delivery_lag_ms_p99": lags[min(len(lags) - 1, int(len(lags) * 0.99))],
        # the part of TTFT p50 the client adds: TTFT error vs the server's stamps ~ this / reference TTFT
        "first_delivery_lag_ms_p50": statistics.median(first_lags),
        "responses_per_s": len(lags) / span_s if span_s > 0 else None,
        "zero_gap_share": sum(1 for g in gaps if g <= 0) / len(gaps) if gaps else 0.0,
    }


class CpuSampler:
    """Read from /proc every 10 ms with a CLOCK_MONOTONIC stamp, so both can be taken inside a tool's measured window:
    the CPU time (user + system) of this script's descendant processes named `name` (perf_analyzer has no own
    figure; ours is the bench's client_cpu_busy_share), and the machine's CPU time by kind (its steal share)."""

    def __init__(self, name: str):
        self.name = name
        self.samples: dict[int, list[tuple[int, float]]] = {}  # pid -> [(monotonic ns, CPU seconds)]
        self.machine: list[tuple[int, tuple[int, ...]]] = []  # [(monotonic ns, machine_cpu_ticks())]
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def _descendants(pid: int) -> list[int]:
        """Every process under `pid`, from the kernel's per-thread children lists (a few reads, not a /proc scan)."""
        found, todo = [], [pid]
        while todo:
            parent = todo.pop()
            try:
                tasks = list(os.scandir(f"/proc/{parent}/task"))
            except OSError:
                continue
            for task in tasks:
                try:
                    children = [int(c) for c in Path(task.path, "children").read_text().split()]
                except OSError:
                    continue
                found += children
                todo += children
        return found

    def _run(self) -> None:
        while not self.stop.is_set():
            ticks = machine_cpu_ticks()
            if ticks is not None:
                self.machine.append((time.monotonic_ns(), ticks))
            for pid in self._descendants(os.getpid()):
                try:
                    if Path(f"/proc/{pid}/comm").read_text().strip() != self.name:
                        continue
                except OSError:
                    continue
                seconds = cpu_seconds(pid)
                if seconds is not None:
                    self.samples.setdefault(pid, []).append((time.monotonic_ns(), seconds))
            self.stop.wait(0.01)

    def __enter__(self) -> CpuSampler:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()

    def steal_between(self, start_ns: int, end_ns: int) -> float | None:
        """The machine's steal share over [start_ns, end_ns] (one 10 ms sample outside it at each end)."""
        before = [ticks for t, ticks in self.machine if t <= start_ns]
        after = [ticks for t, ticks in self.machine if t >= end_ns]
        return steal_share(before[-1], after[0]) if before and after else None

    def seconds_between(self, start_ns: int, end_ns: int) -> float | None:
        """CPU seconds of the process that ran over [start_ns, end_ns]: from its last sample at or before the start to
        its first sample at or after the end, or its last one when it exited first (one 10 ms clock tick at each end)."""
        for samples in self.samples.values():
            before = [cpu for t, cpu in samples if t <= start_ns]
            after = [cpu for t, cpu in samples if t >= end_ns] or [samples[-1][1]]
            if before and samples[-1][0] > start_ns:
                return after[0] - before[-1]
        return None


def _checked(argv: list[str], **kwargs) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=3600, **kwargs)
    if proc.returncode != 0:
        said = (proc.stderr.strip() or proc.stdout.strip()).splitlines()
        raise RuntimeError(f"{Path(argv[0]).name} exit {proc.returncode}: {said[-1] if said else ''}")
    return proc


def emitted_run(tool: str, bench_options: dict[str, Any], out: Path) -> tuple[dict[str, Any], str]:
    """`bench --emit TOOL` (nothing sent but a config read), its one printed command run as printed with the
    configured executable in place of the bare name, the export read by `bench import`: (summary, command)."""
    from bench_support.cli_argv import bench_argv

    from trtllm_forge.bench.tools.registry import tool as bench_tool

    emitted = json.loads(_checked(bench_argv(**bench_options, out=out / "emit", extra=("--emit", tool))).stdout)
    (command,) = emitted["emitted"][0]["commands"]
    argv = shlex.split(command)
    assert argv[0] == tool, command
    found = bench_tool(tool).executable()
    binary, env = found.path, found.env
    out.mkdir(parents=True, exist_ok=True)
    _checked([binary, *argv[1:]], env=env, cwd=out)
    export = argv[argv.index("--artifact-dir") + 1]
    import_argv = [sys.executable, "-m", "trtllm_forge", "bench", "import", export, "--out", str(out / "imported"), "--json"]
    imported = json.loads(_checked(import_argv).stdout)
    (run_dir,) = imported["runs"]
    return json.loads((Path(run_dir) / "summary.json").read_text()), command


def aiperf_http_stats(artifacts: Path) -> dict[str, float | None]:
    """AIPerf's own per-request HTTP breakdown (profile_export.jsonl): request sent → first byte, and the share of
    requests on a reused connection. Its exports keep no response outputs, so no server stamps."""
    waiting, reused = [], []
    for export in artifacts.rglob("profile_export.jsonl"):
        for line in export.read_text().splitlines():
            metrics = json.loads(line).get("metrics") or {}
            if "http_req_waiting" in metrics:
                waiting.append(metrics["http_req_waiting"]["value"])
            if "http_req_connection_reused" in metrics:
                reused.append(metrics["http_req_connection_reused"]["value"])
    return {
        "http_waiting_ms_p50": statistics.median(waiting) if waiting else None,
        "connection_reused_share": statistics.mean(reused) if reused else None,
    }


def one_run(tool: str, urls: dict[str, str], model: str, concurrency: int, n: int, osl: int, out: Path, tokenizer: Path | None) -> Row:
    """One run, each tool in its own process, as a user runs it: ours and perf_analyzer through `bench`
    (`--tool perf_analyzer`), GenAI-Perf and AIPerf as `bench --emit` prints them."""
    from bench_support.cli_argv import bench_argv

    http = tool == "aiperf"
    if http and "http" not in urls:
        raise RuntimeError("no HTTP URL for AIPerf on this server")
    options: dict[str, Any] = dict(
        url=urls["http" if http else "grpc"],
        target="triton-http" if http else None,
        model=model,
        concurrency=concurrency,
        num_requests=n,
        warmup=min(concurrency, 4),
        input_len=ISL,
        output_len=osl,
        tokenizer=tokenizer,
    )
    offset_before = wall_minus_monotonic_ns()
    started = time.time()
    command = None
    with CpuSampler("perf_analyzer") as sampled:  # no perf_analyzer process when our bench runs
        if tool in EMITTED:
            summary, command = emitted_run(tool, options, out)
        else:
            argv = bench_argv(**options, out=out, tool=None if tool == "trtllm-forge" else tool, extra=("--request-timeout", "120"))
            summary = json.loads(_checked(argv).stdout)
    offset_after = wall_minus_monotonic_ns()
    m = summary["metrics"]
    row: Row = {
        "tool": tool,
        "model": model,
        "concurrency": concurrency,
        "requests": summary["requests"].get("completed"),
        "wall_s": round(time.time() - started, 2),
        "load_average_after": os.getloadavg()[0],
    }
    for name, stat in METRICS:
        row[f"{name}_{stat}"] = (m.get(name) or {}).get(stat)
    row["request_throughput_per_s"] = (m.get("request_throughput_per_s") or {}).get("avg")
    row["output_tokens_avg"] = (m.get("output_tokens") or {}).get("avg")
    row["client_cpu_busy_share"] = (summary.get("self_checks") or {}).get("client_cpu_busy_share")
    if command:
        row["emitted_command"] = command
    if tool == "aiperf":
        row.update(aiperf_http_stats(out))
    if tool == "trtllm-forge":
        stamps = forge_stamps(out)
    else:
        exports = [p for p in out.rglob("profile_export.json")]  # PA's raw export (GenAI-Perf keeps it too)
        stamps = pa_export_stamps(exports[0], (offset_before + offset_after) // 2) if exports else []
        row["clock_offset_drift_us"] = round((offset_after - offset_before) / 1e3, 1)
    row.update(stamp_stats(stamps))
    window = measured_window(stamps)
    row["steal_share"] = sampled.steal_between(*window) if window else None
    row["client_cpu_us_per_response"] = client_cpu_per_response(tool, stamps, row, None if tool in EMITTED else sampled)
    return row


def measured_window(stamps: list[Stamps]) -> tuple[int, int] | None:
    """First send to last token-carrying response, on CLOCK_MONOTONIC."""
    usable = [r for r in stamps if r.recv_ns]
    return (min(r.sent_ns for r in usable), max(r.recv_ns[-1] for r in usable)) if usable else None


def client_cpu_per_response(tool: str, stamps: list[Stamps], row: Row, tool_cpu: CpuSampler | None) -> float | None:
    """The client's CPU per token-carrying response over the measured window (first send to last response): ours
    from its own CPU share of the run, perf_analyzer's from /proc (CpuSampler). The empty final responses are not
    counted but cost CPU too (one per request)."""
    window = measured_window(stamps)
    if window is None:
        return None
    start, end = window
    responses = sum(len(r.recv_ns) for r in stamps)
    if tool == "trtllm-forge" and row.get("client_cpu_busy_share") is not None:
        seconds = row["client_cpu_busy_share"] * (end - start) / 1e9
    elif tool_cpu is not None:
        seconds = tool_cpu.seconds_between(start, end)
    else:
        return None
    return None if seconds is None else round(seconds / responses * 1e6, 1)


def interleaved(
    document: dict[str, Any],
    section: str,
    tools: list[str],
    urls: dict[str, str],
    model: str,
    concurrencies: list[int],
    n_of,
    osl: int,
    root: Path,
    tokenizer,
) -> None:
    """Every tool at every concurrency, `repeats` times, the order of the tools rotated per repeat. Only GenAI-Perf,
    AIPerf and the CPU deployment get the tokenizer: the timing model counts tokens itself, and loading a tokenizer
    costs each run tens of seconds on a busy machine."""
    for repeat in range(document["repeats"]):
        for concurrency in concurrencies:
            order = tools[repeat % len(tools) :] + tools[: repeat % len(tools)]
            for tool in order:
                for attempt in range(1 + STEAL_RERUNS):
                    out = root / f"{section}-{tool}-{repeat}-c{concurrency}" / f"attempt-{attempt}"
                    try:
                        needs_tokenizer = tool in EMITTED or section == "cpu"
                        row = one_run(tool, urls, model, concurrency, n_of(concurrency), osl, out, tokenizer if needs_tokenizer else None)
                    except Exception as exc:
                        row = {"tool": tool, "model": model, "concurrency": concurrency, "error": f"{type(exc).__name__}: {exc}"}
                    row["repeat"] = repeat
                    stolen = (row.get("steal_share") or 0) > STEAL_WARN_SHARE
                    if stolen and attempt < STEAL_RERUNS:
                        row["rerun"] = f"the hypervisor took {row['steal_share']:.1%} of the machine's CPU time (steal): run again"
                    document[section].append(row)
                    print(section, json.dumps(row), flush=True)
                    if document.get("partial_out"):
                        save(document, Path(document["partial_out"]))  # an interrupted run keeps what it measured
                    if "rerun" not in row:
                        break


def run(
    repeats: int,
    concurrencies: list[int],
    flood_concurrencies: list[int],
    n_per_run: int,
    tokenizer: Path | None,
    cpu_url: str | None,
    cpu_model: str,
    cpu_requests: int = 8,
    cpu_http_url: str | None = None,
    cpu_repeats: int | None = None,
    partial_out: Path | None = None,
    only: list[str] | None = None,
) -> dict[str, Any]:
    from bench_support.local_triton import render_timing_model, start_triton

    from trtllm_forge.bench.perf_analyzer import problem

    tools = ["trtllm-forge"]
    skipped: dict[str, str] = {}
    pa_problem = problem()
    if pa_problem is None:
        tools.append("perf_analyzer")
    else:
        skipped["perf_analyzer"] = pa_problem
    for tool in EMITTED:
        if not os.environ.get(TOOL_ENV[tool]):
            skipped[tool] = f"{TOOL_ENV[tool]} not set"
        elif tool == "genai-perf" and (tokenizer is None or pa_problem is not None):
            skipped[tool] = "--tokenizer not given" if tokenizer is None else f"perf_analyzer (which it runs) cannot run: {pa_problem}"
        else:
            tools.append(tool)
    if only is not None:
        unknown = sorted(set(only) - set(TOOLS))
        if unknown:
            raise SystemExit(f"--tools: unknown {', '.join(unknown)}; the tools are {', '.join(TOOLS)}")
        skipped.update({tool: "not in --tools" for tool in tools if tool not in only})
        tools = [tool for tool in tools if tool in only]
    if tokenizer is not None:
        check_tokenizer(tokenizer)
    document: dict[str, Any] = {
        "schema": "trtllm-forge.bench-tools-fidelity/2",
        "git_commit": git_commit(),
        "machine": machine(),
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "timing_model": {"ttft_ms": TTFT_MS, "gap_ms": GAP_MS, "output_tokens": OSL, "input_tokens": ISL},
        "truth": {"ttft_ms": TTFT_MS, "itl_ms": GAP_MS, "tpot_ms": GAP_MS, "e2e_ms": TTFT_MS + (OSL - 1) * GAP_MS},
        "flood_model": {"output_tokens": FLOOD_OSL, "instances": FLOOD_INSTANCES, "ttft_ms": 1.0, "gap_ms": 0.0},
        "cpu_deployment": {"url": cpu_url, "http_url": cpu_http_url, "model": cpu_model} if cpu_url else None,
        "tokenizer": str(tokenizer) if tokenizer else None,
        "tools": tools,
        "skipped": skipped,
        "repeats": repeats,
        "partial_out": str(partial_out) if partial_out else None,
        "cpu_repeats": repeats if cpu_repeats is None else cpu_repeats,
        "runs": [],
        "flood": [],
        "cpu": [],
    }
    flood_tools = [t for t in tools if t not in EMITTED]
    with tempfile.TemporaryDirectory(prefix="tools-fidelity-") as tmp:
        root = Path(tmp)
        render_timing_model(root / "repo", "ensemble", ttft_ms=TTFT_MS, gap_ms=GAP_MS)
        render_timing_model(root / "repo", "flood", ttft_ms=1.0, gap_ms=0.0, instances=FLOOD_INSTANCES)
        server = start_triton(root / "repo", root)
        urls = {"grpc": server.grpc_url, "http": server.http_url}
        try:
            interleaved(document, "runs", tools, urls, "ensemble", concurrencies, lambda c: max(n_per_run, 4 * c), OSL, root, tokenizer)
            interleaved(
                document,
                "flood",
                flood_tools,
                urls,
                "flood",
                flood_concurrencies,
                lambda c: max(FLOOD_MIN_REQUESTS, 2 * c),
                FLOOD_OSL,
                root,
                tokenizer,
            )
        finally:
            server.stop()
        if cpu_url:
            document["repeats"], timing_repeats = document["cpu_repeats"], repeats
            cpu_urls = {"grpc": cpu_url, **({"http": cpu_http_url} if cpu_http_url else {})}
            interleaved(document, "cpu", tools, cpu_urls, cpu_model, concurrencies, lambda c: max(cpu_requests, c), OSL, root, tokenizer)
            document["repeats"] = timing_repeats
    document.pop("partial_out", None)
    document["finished_utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    document["machine"]["load_average_end"] = list(os.getloadavg())
    return document


def check_tokenizer(tokenizer: Path) -> None:
    """GenAI-Perf's TPOT divides by the tokens it counts in the text: one per timing-model response or it is wrong
    (a GGUF-derived tokenizer counted " tok" as two tokens and halved GenAI-Perf's TPOT)."""
    from trtllm_forge.bench.workload import load_tokenizer

    loaded = load_tokenizer(tokenizer)
    counted = len(loaded.encode(" tok" * OSL, add_special_tokens=False))
    if counted != OSL:
        raise SystemExit(
            f"--tokenizer {tokenizer}: counts {counted} tokens in the timing model's {OSL} responses (' tok' each), not {OSL}; "
            "use the imported SmolLM2 checkpoint (trtllm-forge import configs/smollm2-cpu.yaml → <workdir>/import/checkpoint)"
        )


def save(document: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(document, indent=2) + "\n")
    os.replace(tmp, path)


# ---- the README block, from the results file ----


def _median(rows: list[Row], key: str) -> float | None:
    values = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(values) if values else None


def _pct(value: float | None, truth: float | None) -> str:
    if value is None or not truth:
        return "-"
    return f"{(value - truth) / truth * 100:+.1f}%"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def compared_rows(document: dict[str, Any], section: str) -> list[Row]:
    """The runs that count: not failed, not superseded by a rerun (see STEAL_RERUNS)."""
    return [r for r in document.get(section) or [] if "error" not in r and "rerun" not in r]


def _groups(document: dict[str, Any], section: str) -> list[tuple[int, str, list[Row]]]:
    rows = compared_rows(document, section)
    keys = sorted({(r["concurrency"], r["tool"]) for r in rows}, key=lambda k: (k[0], TOOLS.index(k[1]) if k[1] in TOOLS else 9))
    return [(c, tool, [r for r in rows if r["concurrency"] == c and r["tool"] == tool]) for c, tool in keys]


def _ref_errors(rows: list[Row], measured: str, reference: str) -> list[float]:
    """Per run: the tool's value against the reference from the server's stamps, as a fraction."""
    return [r[measured] / r[reference] - 1 for r in rows if r.get(reference) and r.get(measured)]


def ttft_error(rows: list[Row]) -> float | None:
    """TTFT p50 against the server's stamps (reference TTFT = model's first send − the tool's send): median over runs."""
    errors = _ref_errors(rows, "ttft_ms_p50", "ref_ttft_ms_p50")
    return statistics.median(errors) if errors else None


GOAL_TTFT_ERROR = 0.02  # issue 15.6: TTFT p50 within 2% of the truth at concurrency <= 64


def goal_table(document: dict[str, Any]) -> list[str]:
    """Issue 15.6 in one table: per tool, TTFT p50 error against the server's stamps at each concurrency of the
    timing model (|error| <= 2% is the goal; the smallest |error| in a column is bold) and responses/s consumed
    at each flood concurrency (the fastest in bold)."""
    timing = _groups(document, "runs")
    flood = _groups(document, "flood")
    tools = [t for t in TOOLS if any(tool == t for _, tool, _ in timing + flood)]
    t_conc = sorted({c for c, _, _ in timing})
    f_conc = sorted({c for c, _, _ in flood})
    errors = {(c, tool): ttft_error(rows) for c, tool, rows in timing}
    rates = {(c, tool): _median(rows, "responses_per_s") for c, tool, rows in flood}
    best_error = {c: min((abs(v) for (cc, _), v in errors.items() if cc == c and v is not None), default=None) for c in t_conc}
    best_rate = {c: max((v for (cc, _), v in rates.items() if cc == c and v is not None), default=None) for c in f_conc}
    header = ["tool"] + [f"TTFT error c={c}" for c in t_conc] + [f"flood resp/s c={c}" for c in f_conc]
    lines = ["| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
    for tool in tools:
        cells = [tool]
        for c in t_conc:
            value = errors.get((c, tool))
            text = "-" if value is None else f"{value * 100:+.1f}%" + ("" if abs(value) <= GOAL_TTFT_ERROR else " ✗")
            cells.append(f"**{text}**" if value is not None and abs(value) == best_error[c] else text)
        for c in f_conc:
            rate = rates.get((c, tool))
            text = "-" if rate is None else f"{rate:,.0f}"
            cells.append(f"**{text}**" if rate is not None and rate == best_rate[c] else text)
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def repeat_winners(document: dict[str, Any]) -> list[str]:
    """Per point, which tool won within each repeat (the tools of one repeat ran interleaved, minutes apart at most, so
    comparing inside a repeat takes out the machine's drift between repeats that medians over repeats keep)."""

    def winners(section: str, score) -> list[str]:
        rows = [r for r in compared_rows(document, section) if "repeat" in r]
        cells = []
        for concurrency in sorted({r["concurrency"] for r in rows}):
            wins: dict[str, int] = {}
            compared = 0  # repeats with at least two tools to compare
            for repeat in sorted({r["repeat"] for r in rows if r["concurrency"] == concurrency}):
                scored = [(score(r), r["tool"]) for r in rows if r["concurrency"] == concurrency and r["repeat"] == repeat]
                scored = [(value, tool) for value, tool in scored if value is not None]
                if len(scored) > 1:
                    compared += 1
                    best = min(scored)[1]
                    wins[best] = wins.get(best, 0) + 1
            ranked = sorted(wins.items(), key=lambda item: (-item[1], TOOLS.index(item[0]) if item[0] in TOOLS else 9))
            if compared:
                cells.append(f"c={concurrency}: " + ", ".join(f"{tool} {n}" for tool, n in ranked) + f" of {compared}")
        return cells

    def ttft_score(row: Row) -> float | None:
        return abs(row["ttft_ms_p50"] / row["ref_ttft_ms_p50"] - 1) if row.get("ref_ttft_ms_p50") and row.get("ttft_ms_p50") else None

    def flood_score(row: Row) -> float | None:
        return -row["responses_per_s"] if row.get("responses_per_s") else None

    lines = []
    timing = winners("runs", ttft_score)
    if timing:
        lines.append("Most accurate TTFT p50 within each repeat: " + "; ".join(timing) + ".")
    flood = winners("flood", flood_score)
    if flood:
        lines.append("Fastest flood consumer within each repeat: " + "; ".join(flood) + ".")
    return lines


def _pct_of(value: float | None, base: float | None) -> float | None:
    return None if value is None or not base else (value - base) / base * 100


def explanations(document: dict[str, Any]) -> list[str]:
    """One line per difference larger than 5% in the tables, with the numbers from the same runs that explain it."""
    truth = document["truth"]
    lines: list[str] = []
    for concurrency, tool, rows in _groups(document, "runs"):
        where = f"c={concurrency} {tool}"
        ttft = _median(rows, "ttft_ms_p50")
        off = _pct_of(ttft, truth["ttft_ms"])
        ref_error = ttft_error(rows)
        server_ttft, path = _median(rows, "server_ttft_ms_p50"), _median(rows, "request_path_ms_p50")
        if off is not None and abs(off) > 5 and _median(rows, "ref_ttft_ms_p50") is None:
            others = [r for c, t, r in _groups(document, "runs") if c == concurrency and t != tool]
            refs = [v for r in others for v in [_median(r, "ref_ttft_ms_p50")] if v is not None]
            lines.append(
                f"- {where}, TTFT {off:+.1f}% vs the schedule: its export keeps no server stamps (its own timings only), so "
                "the server's lateness cannot be taken out"
                + (f"; the other tools' reference TTFT at this concurrency: {_ms(min(refs))}–{_ms(max(refs))} ms" if refs else "")
                + (" (over Triton's HTTP generate_stream, the others over gRPC)" if tool == "aiperf" else "")
                + (
                    f"; AIPerf's own breakdown: request sent → first byte {_ms(_median(rows, 'http_waiting_ms_p50'))} ms, "
                    f"connection reused for {_median(rows, 'connection_reused_share') or 0:.0%} of requests"
                    if _median(rows, "http_waiting_ms_p50") is not None
                    else ""
                )
            )
        elif off is not None and abs(off) > 5:
            cause = f"reference TTFT (model's first send − tool's send) {_ms(_median(rows, 'ref_ttft_ms_p50'))} ms"
            if server_ttft is not None:
                cause += f" = the model's own TTFT {_ms(server_ttft)} ms + request path {_ms(path)} ms"
            lines.append(
                f"- {where}, TTFT {off:+.1f}% vs the schedule: {cause}; against the server's stamps the tool is "
                + ("-" if ref_error is None else f"{ref_error * 100:+.1f}%")
                + ("" if ref_error is None or abs(ref_error) * 100 >= abs(off) / 2 else ": the server was late, not the tool")
            )
        if ref_error is not None and abs(ref_error) * 100 > 5:
            lines.append(
                f"- {where}, TTFT {ref_error * 100:+.1f}% vs the server's stamps: the first response's delivery (delivery lag "
                f"p50 / p99 {_ms(_median(rows, 'delivery_lag_ms_p50'))} / {_ms(_median(rows, 'delivery_lag_ms_p99'))} ms over all "
                f"responses; load average after the runs {_median(rows, 'load_average_after') or 0:.1f})"
            )
        for metric, ref_key in (("tpot_ms", "ref_tpot_ms_p50"), ("itl_ms", "ref_tpot_ms_p50"), ("e2e_ms", "ref_e2e_ms_p50")):
            value = _median(rows, f"{metric}_p50")
            off = _pct_of(value, truth[metric])
            if off is None or abs(off) <= 5:
                continue
            ref = _median(rows, ref_key)
            name = metric.split("_")[0].upper()
            if ref is None:
                lines.append(f"- {where}, {name} p50 {off:+.1f}% vs the schedule: this file has no server reference for it")
                continue
            ref_off, vs_ref = _pct_of(ref, truth[metric]) or 0.0, _pct_of(value, ref) or 0.0
            who = "the server was late" if abs(ref_off) >= abs(vs_ref) else "the tool adds most of it"
            lines.append(
                f"- {where}, {name} p50 {off:+.1f}% vs the schedule: the model's own stamps give {_ms(ref)} ms "
                f"({ref_off:+.1f}% vs the schedule), the tool {vs_ref:+.1f}% against them: {who}"
            )
    for concurrency, tool, rows in _groups(document, "flood"):
        others = [r for c, t, r in _groups(document, "flood") if c == concurrency and t != tool]
        rate = _median(rows, "responses_per_s")
        best_other = max((_median(r, "responses_per_s") or 0 for r in others), default=0)
        if rate and best_other and rate < best_other * 0.95:
            lines.append(
                f"- flood c={concurrency}, {tool} consumed {rate:,.0f} responses/s, {_pct_of(rate, best_other):+.1f}% vs the fastest "
                f"({best_other:,.0f}); delivery lag p50 / p99 {_ms(_median(rows, 'delivery_lag_ms_p50'))} / "
                f"{_ms(_median(rows, 'delivery_lag_ms_p99'))} ms; the model's own TTFT {_ms(_median(rows, 'server_ttft_ms_p50'))} ms "
                "(the model, on the same 2 cores as the clients, sets the pace: a client's CPU is the model's loss)"
                + (
                    f"; our client's CPU {_median(rows, 'client_cpu_busy_share') or 0:.0%} of a core"
                    if tool == "trtllm-forge" and _median(rows, "client_cpu_busy_share") is not None
                    else ""
                )
                + (
                    "; client CPU per response "
                    + ", ".join(
                        f"{t} {_median(r, 'client_cpu_us_per_response'):.0f} µs"
                        for c, t, r in _groups(document, "flood")
                        if c == concurrency and _median(r, "client_cpu_us_per_response") is not None
                    )
                    if _median(rows, "client_cpu_us_per_response") is not None
                    else ""
                )
            )
    cpu = _groups(document, "cpu")
    for concurrency, tool, rows in cpu:
        base = [r for c, t, r in cpu if c == concurrency and t == "perf_analyzer"]
        if tool == "perf_analyzer" or not base:
            continue
        for metric in ("ttft_ms_p50", "e2e_ms_p50"):
            off = _pct_of(_median(rows, metric), _median(base[0], metric))
            if off is None or abs(off) <= 5:
                continue
            tpots = [v for c, _, r in cpu if c == concurrency for v in [_median(r, "tpot_ms_p50")] if v is not None]
            lines.append(
                f"- CPU c={concurrency} {tool}, {metric.split('_')[0].upper()} p50 {off:+.1f}% vs perf_analyzer: no truth here and "
                f"the runs are minutes apart; the server's own pace moved between them (TPOT p50 of the tools' runs at this "
                f"concurrency: {min(tpots):.0f}–{max(tpots):.0f} ms)"
            )
    return lines or ["- none: every value is within 5% of its reference"]


def timing_table(document: dict[str, Any]) -> list[str]:
    truth = document["truth"]
    lines = [
        "| concurrency | tool | runs | TTFT p50 (ms) | error vs schedule | error vs server stamps | delivery lag p50 / p99 (ms) "
        "| TPOT p50 error | ITL p50 error | E2E p50 error | req/s |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for concurrency, tool, rows in _groups(document, "runs"):
        ttft = _median(rows, "ttft_ms_p50")
        lag50, lag99 = _median(rows, "delivery_lag_ms_p50"), _median(rows, "delivery_lag_ms_p99")
        ref = _ref_errors(rows, "ttft_ms_p50", "ref_ttft_ms_p50")
        rate = _median(rows, "request_throughput_per_s")
        cells = [
            str(concurrency),
            tool,
            str(len(rows)),
            _ms(ttft),
            _pct(ttft, truth["ttft_ms"]),
            f"{statistics.median(ref) * 100:+.1f}%" if ref else "-",
            f"{_ms(lag50)} / {_ms(lag99)}",
            _pct(_median(rows, "tpot_ms_p50"), truth["tpot_ms"]),
            _pct(_median(rows, "itl_ms_p50"), truth["itl_ms"]),
            _pct(_median(rows, "e2e_ms_p50"), truth["e2e_ms"]),
            "-" if rate is None else f"{rate:.1f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def flood_table(document: dict[str, Any]) -> list[str]:
    lines = [
        "| concurrency | tool | runs | responses/s consumed | client CPU per response (µs) | delivery lag p50 / p99 (ms) | zero gaps "
        "| server TTFT p50 (ms) | steal |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for concurrency, tool, rows in _groups(document, "flood"):
        rate, zero = _median(rows, "responses_per_s"), _median(rows, "zero_gap_share")
        cpu, steal = _median(rows, "client_cpu_us_per_response"), _median(rows, "steal_share")
        cells = [
            str(concurrency),
            tool,
            str(len(rows)),
            "-" if rate is None else f"{rate:,.0f}",
            "-" if cpu is None else f"{cpu:.0f}",
            f"{_ms(_median(rows, 'delivery_lag_ms_p50'))} / {_ms(_median(rows, 'delivery_lag_ms_p99'))}",
            "-" if zero is None else f"{zero:.2%}",
            _ms(_median(rows, "server_ttft_ms_p50")),
            "-" if steal is None else f"{steal:.1%}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def cpu_table(document: dict[str, Any]) -> list[str]:
    lines = [
        "| concurrency | tool | runs | TTFT p50 (ms) | vs perf_analyzer | TPOT p50 (ms) | ITL p50 (ms) | E2E p50 (ms) | vs perf_analyzer | req/s |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    groups = _groups(document, "cpu")
    pa = {c: rows for c, tool, rows in groups if tool == "perf_analyzer"}
    for concurrency, tool, rows in groups:
        base = pa.get(concurrency, [])
        ttft, e2e, rate = _median(rows, "ttft_ms_p50"), _median(rows, "e2e_ms_p50"), _median(rows, "request_throughput_per_s")
        cells = [
            str(concurrency),
            tool,
            str(len(rows)),
            _ms(ttft),
            _pct(ttft, _median(base, "ttft_ms_p50")),
            _ms(_median(rows, "tpot_ms_p50")),
            _ms(_median(rows, "itl_ms_p50")),
            _ms(e2e),
            _pct(e2e, _median(base, "e2e_ms_p50")),
            "-" if rate is None else f"{rate:.2f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def emitted_line(document: dict[str, Any]) -> list[str]:
    """Issue 15.2: how many of the `bench --emit` commands run here exited 0 and were read by `bench import`."""
    rows = [r for section in ("runs", "cpu") for r in document.get(section) or [] if r["tool"] in EMITTED]
    if not rows:
        return []
    counts = {
        tool: (sum(1 for r in rows if r["tool"] == tool and "error" not in r), sum(1 for r in rows if r["tool"] == tool))
        for tool in EMITTED
    }
    said = "; ".join(f"{tool} {ok} of {total}" for tool, (ok, total) in counts.items() if total)
    skipped = "; ".join(f"{tool} skipped: {why}" for tool, why in (document.get("skipped") or {}).items() if tool in EMITTED)
    return [
        f"Emitted commands (`bench --emit`, run as printed, export read by `bench import`; the file keeps each command): {said} ran"
        + (f"; {skipped}" if skipped else ""),
        "",
    ]


def readme_table(document: dict[str, Any] | None = None) -> str:
    """The README block between the bench-fidelity-table markers, from `document` (default: the committed file)."""
    if document is None:
        document = json.loads(RESULTS.read_text())
    truth = document["truth"]
    every_run = [r for section in ("runs", "flood", "cpu") for r in document.get(section) or []]
    failed = sum(1 for r in every_run if "error" in r)
    rerun = sum(1 for r in every_run if "rerun" in r)
    lines = [
        measured_where({k: v for k, v in document.items() if k != "note"})
        + f"; medians over {document['repeats']} interleaved repeats"
        + (f"; {failed} failed run(s) left out (in the file)" if failed else "")
        + (
            f"; {rerun} run(s) during which the hypervisor took over {STEAL_WARN_SHARE:.0%} of the CPU time (steal) "
            "run again, left out (in the file)"
            if rerun
            else ""
        )
        + (f"; note: {document['note']}" if document.get("note") else ""),
        "",
        f"Timing model: TTFT {truth['ttft_ms']:g} ms, gap {truth['itl_ms']:g} ms, {document['timing_model']['output_tokens']} tokens "
        f"(E2E truth {truth['e2e_ms']:g} ms)",
        "",
        *emitted_line(document),
        "Issue 15.6: TTFT p50 error against the server's stamps at each concurrency (goal: within ±2%, ✗ = outside; "
        "bold = the most accurate tool) and responses/s consumed from the flood model (bold = the fastest):",
        "",
        *goal_table(document),
        "",
        *repeat_winners(document),
        "",
        *timing_table(document),
    ]
    if document.get("flood"):
        flood = document["flood_model"]
        lines += [
            "",
            f"Flood model: {flood['output_tokens']} tokens back to back per request, {flood['instances']} model instances",
            "",
            *flood_table(document),
        ]
    if document.get("cpu"):
        lines += [
            "",
            f"CPU deployment (SmolLM2-135M, OpenVINO, `{document['cpu_deployment']['model']}`, {ISL} tokens in, {OSL} out): no truth, "
            f"the tools side by side; medians over {document.get('cpu_repeats', document['repeats'])} interleaved repeats",
            "",
        ]
        lines += cpu_table(document)
    lines += ["", "Differences above 5% in the tables above (generated from the same file):", "", *explanations(document)]
    return "\n".join(lines) + "\n"


def update_readme(document: dict[str, Any] | None = None) -> None:
    text = README.read_text()
    start, end = MARKERS
    if start not in text or end not in text:
        raise SystemExit(f"{README} has no {start} ... {end} block")
    before, rest = text.split(start, 1)
    _, after = rest.split(end, 1)
    README.write_text(before + start + "\n" + readme_table(document) + end + after)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--concurrency", default="1,4,16,64")
    parser.add_argument("--flood-concurrency", default="1,16,64", help="concurrencies of the flood part ('' to skip it)")
    parser.add_argument("--requests", type=int, default=96, help="requests per timing-model run (at least 4 x concurrency)")
    parser.add_argument("--tokenizer", type=Path, default=None, help="HF tokenizer dir (GenAI-Perf needs one)")
    parser.add_argument("--cpu-url", default=None, help="gRPC HOST:PORT of a running CPU deployment to compare the tools on")
    parser.add_argument("--cpu-http-url", default=None, help="HTTP URL of the same CPU deployment (AIPerf speaks HTTP)")
    parser.add_argument("--cpu-model", default="ensemble")
    parser.add_argument("--cpu-requests", type=int, default=8, help="requests per CPU-deployment run (at least the concurrency)")
    parser.add_argument("--cpu-repeats", type=int, default=None, help="repeats on the CPU deployment (default: --repeats)")
    parser.add_argument("--tools", default=None, help="comma-separated subset of the tools to run (default: every one installed)")
    parser.add_argument("--note", default=None, help="a note stored with the results (e.g. that the machine was loaded)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--readme", action="store_true", help="regenerate the README block from the new file")
    parser.add_argument("--readme-only", action="store_true", help="regenerate the README block from --out; run nothing")
    args = parser.parse_args()
    if args.readme_only:
        update_readme(json.loads(args.out.read_text()))
        return 0
    document = run(
        args.repeats,
        [int(c) for c in args.concurrency.split(",")],
        [int(c) for c in args.flood_concurrency.split(",") if c],
        args.requests,
        args.tokenizer,
        args.cpu_url,
        args.cpu_model,
        args.cpu_requests,
        cpu_http_url=args.cpu_http_url,
        cpu_repeats=args.cpu_repeats,
        partial_out=args.out.with_name(args.out.stem + ".partial.json"),
        only=args.tools.split(",") if args.tools else None,
    )
    if args.note:
        document["note"] = args.note
    save(document, args.out)
    args.out.with_name(args.out.stem + ".partial.json").unlink(missing_ok=True)
    print(readme_table(document))
    if args.readme:
        update_readme(document)
    return 0


if __name__ == "__main__":
    sys.exit(main())
