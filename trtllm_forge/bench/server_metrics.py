"""Triton's Prometheus endpoint, scraped before and after a run (and sampled during it): per-model request
counts, queue and compute time per request, and TensorRT-LLM KV-cache block metrics when present."""

from __future__ import annotations

import re
import threading
import time
import urllib.request
from collections import defaultdict

_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([^}]*)\})?\s+([-+0-9.eE]+|NaN|\+Inf|-Inf)\s*$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')

COUNTERS = {
    "nv_inference_request_success": "request_success",
    "nv_inference_request_failure": "request_failure",
    "nv_inference_count": "inference_count",
    "nv_inference_exec_count": "exec_count",
    "nv_inference_request_duration_us": "request_duration_us",
    "nv_inference_queue_duration_us": "queue_duration_us",
    "nv_inference_compute_input_duration_us": "compute_input_duration_us",
    "nv_inference_compute_infer_duration_us": "compute_infer_duration_us",
    "nv_inference_compute_output_duration_us": "compute_output_duration_us",
}


def parse(text: str) -> dict[tuple[str, tuple], float]:
    samples = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _LINE.match(line)
        if match:
            labels = tuple(sorted(_LABEL.findall(match.group(3) or "")))
            samples[(match.group(1), labels)] = float(match.group(4))
    return samples


def scrape(url: str | None, timeout: float = 3.0) -> dict | None:
    if not url:
        return None
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return parse(response.read().decode())
    except OSError:
        return None


class Sampler:
    """Scrapes every `period` seconds on a thread (off the event loop) while the load runs."""

    def __init__(self, url: str | None, period: float = 1.0):
        self.url, self.period = url, period
        self.samples: list[tuple[float, dict]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            data = scrape(self.url)
            if data is not None:
                self.samples.append((time.time(), data))

    def __enter__(self) -> Sampler:
        if self.url:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)


def report(before: dict | None, after: dict | None, samples: list[tuple[float, dict]] | None = None) -> dict | None:
    if before is None or after is None:
        return None
    per_model: dict[str, dict] = defaultdict(dict)
    for (name, labels), value in after.items():
        key = COUNTERS.get(name)
        if key is None:
            continue
        model = dict(labels).get("model", "?")
        per_model[model][key] = per_model[model].get(key, 0.0) + value - before.get((name, labels), 0.0)
    models = {}
    for model, c in per_model.items():
        n = c.get("request_success", 0.0) + c.get("request_failure", 0.0)
        if n <= 0:
            continue
        models[model] = {
            "requests": int(n),
            "failures": int(c.get("request_failure", 0)),
            "executions": int(c.get("exec_count", 0)),
            "avg_queue_ms": c.get("queue_duration_us", 0) / n / 1e3,
            "avg_compute_infer_ms": c.get("compute_infer_duration_us", 0) / n / 1e3,
            "avg_request_ms": c.get("request_duration_us", 0) / n / 1e3,
        }
    kv = {
        f"{name}{{{','.join(f'{k}={v}' for k, v in labels)}}}": value
        for (name, labels), value in after.items()
        if name.startswith("nv_trt_llm_kv_cache")
    }
    pending = defaultdict(list)
    for _, data in samples or []:
        for (name, labels), value in data.items():
            if name == "nv_inference_pending_request_count":
                pending[dict(labels).get("model", "?")].append(value)
    return {
        "models": models,
        "kv_cache": kv or None,
        "pending_requests_max": {m: max(v) for m, v in pending.items()} or None,
        "samples": len(samples or []),
    }
