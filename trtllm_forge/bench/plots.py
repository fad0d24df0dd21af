"""PNG plots: TTFT and TPOT CDFs and output tokens over time for a sweep point; the latency–throughput curve
over a sweep."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from trtllm_forge.bench.records import RequestRecord


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _cdf(ax: Any, values: list[float], label: str, xlabel: str) -> None:
    if not values:
        return
    data = np.sort(values)
    ax.step(data, np.arange(1, data.size + 1) / data.size, where="post", label=label)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("share of requests")
    ax.grid(alpha=0.3)


def point_plots(out: Path, records: list[RequestRecord], title: str) -> list[str]:
    plt = _pyplot()
    measured = [r for r in records if r.phase == "measure" and r.ok]
    ttft, tpot = [], []
    token_times: list[int] = []
    token_counts: list[int] = []
    for r in measured:
        times = [(t, n) for t, n in zip(r.recv_ns, r.tokens, strict=False) if n > 0]
        if not times:
            continue
        ttft.append((times[0][0] - r.sent_ns) / 1e6)
        decode = r.output_tokens - times[0][1]
        if decode > 0:
            tpot.append((times[-1][0] - times[0][0]) / 1e6 / decode)
        token_times.extend(t for t, _ in times)
        token_counts.extend(n for _, n in times)
    written = []
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    _cdf(axes[0], ttft, "TTFT", "TTFT (ms)")
    _cdf(axes[1], tpot, "TPOT", "TPOT (ms)")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out / "latency_cdf.png", dpi=100)
    plt.close(fig)
    written.append(str(out / "latency_cdf.png"))
    if token_times:
        start = min(r.sent_ns for r in measured)
        seconds = (np.array(token_times) - start) / 1e9
        bucket = max(0.05, float(seconds.max()) / 100)
        edges = np.arange(0, seconds.max() + bucket, bucket)
        totals, _ = np.histogram(seconds, bins=edges, weights=token_counts)
        fig, ax = plt.subplots(figsize=(8, 3.5))
        ax.plot(edges[:-1], totals / bucket)
        ax.set_xlabel("seconds since the first send")
        ax.set_ylabel("output tokens/s")
        ax.set_title(f"{title}: tokens over time ({bucket * 1e3:.0f} ms buckets)")
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(out / "tokens_over_time.png", dpi=100)
        plt.close(fig)
        written.append(str(out / "tokens_over_time.png"))
    return written


def sweep_plot(out: Path, summaries: list[dict]) -> str:
    plt = _pyplot()
    xs = [s["metrics"]["output_token_throughput_per_s"]["avg"] or 0 for s in summaries]
    fig, ax = plt.subplots(figsize=(7, 4))
    for metric, label in (("ttft_ms", "TTFT p50"), ("e2e_ms", "E2E p50"), ("tpot_ms", "TPOT p50")):
        ax.plot(xs, [s["metrics"][metric]["p50"] for s in summaries], "o-", label=label)
    for x, s in zip(xs, summaries, strict=False):
        load = s["load"]
        ax.annotate(
            f"c={int(load['value'])}" if load["mode"] == "concurrency" else f"r={load['value']:g}",
            (x, s["metrics"]["e2e_ms"]["p50"] or 0),
            fontsize=8,
            textcoords="offset points",
            xytext=(3, 3),
        )
    ax.set_xlabel("output tokens/s")
    ax.set_ylabel("latency (ms)")
    ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title("latency vs throughput")
    fig.tight_layout()
    fig.savefig(out / "latency_throughput.png", dpi=100)
    plt.close(fig)
    return str(out / "latency_throughput.png")
