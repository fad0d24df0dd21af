"""Metrics from per-request records. Definitions (also in the README):

- TTFT: first response carrying >= 1 token − actual send. Empty responses (e.g. Triton's flag-only final
  response) are never timing points; they are counted.
- TTST: second token-bearing response − first.
- E2E: last token-bearing response − actual send.
- TPOT: (E2E − TTFT) / (output tokens − tokens in the first token-bearing response); only when that
  denominator is > 0.
- ITL: gaps between consecutive token-bearing responses, pooled over requests (the per-chunk distribution);
  itl_per_token divides each gap by the tokens of the later response (differs when responses carry several).
- *_from_intended: the same latencies measured from the scheduled send time (coordinated omission).
- Window: first send → last token-bearing response of a measured request. The steady-state window is the
  span during which the number of requests in flight was at its target (closed loop), or from the first
  completion to the last send (open loop).
- With TensorRT-LLM's return_perf_metrics: server_ttft = first_token_time − arrival_time (server clock),
  server_queue = first_scheduled_time − arrival_time, client_minus_server_ttft = client TTFT − server TTFT
  (network, frontend and client overhead; clock-independent since both are intervals).
- Throughputs count completed requests and their output tokens over a window; achieved concurrency is
  Σ E2E / window; goodput counts requests meeting every SLO given.
"""

from __future__ import annotations

import platform
import sys
from collections import Counter
from typing import Any

import numpy as np

from trtllm_forge.bench.records import RequestRecord
from trtllm_forge.bench.runner import RunResult
from trtllm_forge.bench.stats import describe, scalar

MS = 1e6
LATE_NS = 1_000_000  # PA's rule: a request sent more than 1 ms after its schedule is "late"
LATE_WARN_SHARE = 0.01
CPU_WARN_SHARE = 0.5
# Steal above this made flood runs on this 2-core VM ~20-40% slower than runs beside them at ~0% (2026-12-03)
STEAL_WARN_SHARE = 0.05


def _token_times(record: RequestRecord) -> list[tuple[int, int]]:
    return [(t, n) for t, n in zip(record.recv_ns, record.tokens, strict=False) if n > 0]


def _steady_window(result: RunResult, done: list[RequestRecord]) -> tuple[int, int] | None:
    if not done:
        return None
    if result.load.mode == "concurrency":
        events = sorted([(r.sent_ns, 1) for r in done] + [(_token_times(r)[-1][0], -1) for r in done])
        target = int(result.load.value)
        in_flight, first, last = 0, None, None
        for t, step in events:
            if in_flight >= target and first is not None:
                last = t
            in_flight += step
            if in_flight >= target and first is None:
                first = t
        return (first, last) if first is not None and last and last > first else None
    first_done = min(_token_times(r)[-1][0] for r in done)
    last_send = max(r.sent_ns for r in done)
    return (first_done, last_send) if last_send > first_done else None


def summarize(result: RunResult, slo: dict[str, float] | None = None, context: dict | None = None) -> dict:
    measured = [r for r in result.records if r.phase == "measure"]
    done = [r for r in measured if r.ok and _token_times(r)]
    failed = [r for r in measured if not r.ok]
    no_tokens = [r for r in measured if r.ok and not _token_times(r)]
    slo = slo or {}

    ttft, ttst, e2e, tpot, itl, osl, isl = [], [], [], [], [], [], []
    itl_per_token: list[float] = []
    ttft_i, e2e_i, lag, first_any, final_gap, per_user = [], [], [], [], [], []
    delivery: list[float] = []
    zero_gaps, n_gaps = 0, 0
    server_ttft, client_minus_server, server_queue = [], [], []
    empty_responses, good = 0, 0
    osl_mismatch = 0
    for r in measured:
        lag.append(max(0, r.sent_ns - r.intended_ns))
    for r in done:
        times = _token_times(r)
        first_t, first_n = times[0]
        last_t = times[-1][0]
        out = r.output_tokens
        ttft.append((first_t - r.sent_ns) / MS)
        e2e.append((last_t - r.sent_ns) / MS)
        ttft_i.append((first_t - r.intended_ns) / MS)
        e2e_i.append((last_t - r.intended_ns) / MS)
        first_any.append((r.recv_ns[0] - r.sent_ns) / MS)
        if r.final and r.final[-1]:
            final_gap.append((r.recv_ns[-1] - last_t) / MS)
        if len(times) > 1:
            ttst.append((times[1][0] - first_t) / MS)
        gaps = np.diff([t for t, _ in times])
        n_gaps += gaps.size
        zero_gaps += int(np.count_nonzero(gaps <= 0))
        itl.extend((gaps / MS).tolist())
        itl_per_token.extend((gaps / MS / np.array([n for _, n in times[1:]])).tolist())
        decode = out - first_n
        r_tpot = (last_t - first_t) / MS / decode if decode > 0 else None
        if r_tpot is not None:
            tpot.append(r_tpot)
            if r_tpot > 0:
                per_user.append(1000.0 / r_tpot)
        osl.append(out)
        isl.append(r.input_tokens)
        if out != r.requested_output_tokens:
            osl_mismatch += 1
        empty_responses += sum(r.empty)
        if r.server_send_ns and len(r.server_send_ns) == sum(1 for n in r.tokens if n > 0):
            delivery.extend(((t - s) / MS) for (t, _), s in zip(times, r.server_send_ns, strict=False))
        perf = r.server_perf or {}
        if "arrival_time_ns" in perf and "first_token_time_ns" in perf:
            s_ttft = (perf["first_token_time_ns"] - perf["arrival_time_ns"]) / MS
            server_ttft.append(s_ttft)
            client_minus_server.append(ttft[-1] - s_ttft)
            if "first_scheduled_time_ns" in perf:
                server_queue.append((perf["first_scheduled_time_ns"] - perf["arrival_time_ns"]) / MS)
        meets = (
            ttft[-1] <= slo.get("ttft", float("inf"))
            and e2e[-1] <= slo.get("e2e", float("inf"))
            and (r_tpot or 0.0) <= slo.get("tpot", float("inf"))
        )
        good += meets

    window = None
    if done:
        window = (min(r.sent_ns for r in measured), max(_token_times(r)[-1][0] for r in done))
    window_s = (window[1] - window[0]) / 1e9 if window and window[1] > window[0] else None
    steady = _steady_window(result, done)
    steady_s = (steady[1] - steady[0]) / 1e9 if steady else None
    steady_requests = steady_tokens = 0
    if steady:
        for r in done:
            times = _token_times(r)
            steady_tokens += sum(n for t, n in times if steady[0] <= t <= steady[1])
            steady_requests += steady[0] <= times[-1][0] <= steady[1]

    total_out = sum(osl)
    late = sum(1 for x in lag if x > LATE_NS)
    wall_s = (result.end_ns - result.start_ns) / 1e9
    cpu_share = result.cpu_seconds / wall_s if wall_s > 0 else None
    metrics = {
        "ttft_ms": describe(ttft, "ms"),
        "ttst_ms": describe(ttst, "ms"),
        "e2e_ms": describe(e2e, "ms"),
        "tpot_ms": describe(tpot, "ms"),
        "itl_ms": describe(itl, "ms"),
        "itl_per_token_ms": describe(itl_per_token, "ms"),
        "per_user_output_tokens_per_s": describe(per_user, "tokens/s"),
        "ttft_from_intended_ms": describe(ttft_i, "ms"),
        "e2e_from_intended_ms": describe(e2e_i, "ms"),
        "time_to_first_response_ms": describe(first_any, "ms"),
        "final_flag_after_last_token_ms": describe(final_gap, "ms"),
        "dispatch_lag_ms": describe([x / MS for x in lag], "ms"),
        "input_tokens": describe(isl, "tokens"),
        "output_tokens": describe(osl, "tokens"),
        "request_throughput_per_s": scalar(len(done) / window_s if window_s else None, "requests/s"),
        "output_token_throughput_per_s": scalar(total_out / window_s if window_s else None, "tokens/s"),
        "steady_request_throughput_per_s": scalar(steady_requests / steady_s if steady_s else None, "requests/s"),
        "steady_output_token_throughput_per_s": scalar(steady_tokens / steady_s if steady_s else None, "tokens/s"),
        "goodput_per_s": scalar(good / window_s if (window_s and slo) else None, "requests/s"),
        "achieved_concurrency": scalar(sum(e2e) / 1e3 / window_s if window_s else None, "requests"),
        "event_loop_lag_ms": describe([x / MS for x in result.loop_lag_ns], "ms"),
        "client_delivery_lag_ms": describe(delivery, "ms"),
        "server_ttft_ms": describe(server_ttft, "ms"),
        "server_queue_ms": describe(server_queue, "ms"),
        "client_minus_server_ttft_ms": describe(client_minus_server, "ms"),
    }
    checks: dict[str, Any] = {
        "late_share": late / len(measured) if measured else 0.0,
        "late_threshold_ms": LATE_NS / MS,
        "client_cpu_busy_share": cpu_share,
        "steal_share": result.steal_share,
        "zero_gap_share": zero_gaps / n_gaps if n_gaps else 0.0,
        "osl_mismatch_count": osl_mismatch,
        "osl_mismatch_share": osl_mismatch / len(done) if done else 0.0,
        "empty_responses": empty_responses,
        "requests_without_tokens": len(no_tokens),
    }
    warnings = []
    if result.load.mode == "rate" and checks["late_share"] > LATE_WARN_SHARE:
        warnings.append(
            f"{checks['late_share']:.1%} of requests were sent more than 1 ms after their schedule: "
            "the client fell behind; see *_from_intended_ms"
        )
    if cpu_share is not None and cpu_share > CPU_WARN_SHARE:
        warnings.append(f"the client used {cpu_share:.0%} of a CPU core: its own overhead may affect the timings")
    if result.steal_share is not None and result.steal_share > STEAL_WARN_SHARE:
        warnings.append(
            f"the hypervisor gave {result.steal_share:.0%} of this machine's CPU time to other guests during the run (steal): "
            "server and client ran slower than this machine can; compare only with runs taken alongside"
        )
    if osl_mismatch:
        warnings.append(f"{osl_mismatch} of {len(done)} requests produced a different number of tokens than requested")
    if no_tokens:
        warnings.append(f"{len(no_tokens)} requests ended without any token")
    if result.aborted:
        warnings.append(f"sending stopped early: {result.aborted}")
    lag_p99 = metrics["event_loop_lag_ms"]["p99"]
    if lag_p99 is not None and lag_p99 > 1.0:
        warnings.append(f"event-loop lag p99 {lag_p99:.2f} ms: response stamps may be late by as much")
    errors = Counter(r.error_kind for r in failed)
    return {
        "schema": "trtllm-forge.bench/1",
        "load": {
            "mode": result.load.mode,
            "value": result.load.value,
            "arrival": result.load.arrival if result.load.mode == "rate" else None,
            "max_concurrency": result.load.max_concurrency,
            "num_requests": result.load.num_requests,
            "duration_s": result.load.duration_s,
            "warmup_requests": result.load.warmup_requests,
        },
        "requests": {
            "sent": len(measured),
            "completed": len(done),
            "failed": len(failed),
            "errors_by_kind": dict(errors),
            "warmup": len(result.records) - len(measured),
            "retried": sum(1 for r in measured if r.retries),
            "retries": sum(r.retries for r in measured),
        },
        "metrics": metrics,
        "windows": {
            "benchmark": {"definition": "first send -> last token-bearing response (measured requests)", "seconds": window_s},
            "steady_state": {
                "definition": "in flight == target concurrency (closed loop); first completion -> last send (open loop)",
                "seconds": steady_s,
            },
            "run_wall_s": wall_s,
            "wall_clock_start_ns": result.wall_start_ns,
        },
        "self_checks": checks,
        "output_tokens_sources": dict(Counter(r.output_tokens_source for r in done)),
        "aborted": result.aborted,
        "slo_ms": slo or None,
        "warnings": warnings,
        "statistics": "linear-interpolated percentiles (numpy default); std is the population std",
        "versions": {"python": sys.version.split()[0], "platform": platform.platform(), **(context or {}).pop("versions", {})},
        **(context or {}),
    }
