"""Interop with other load generators: write the same workload for perf_analyzer, GenAI-Perf and AIPerf
(`--emit`), and import their exports into our summary schema so `bench compare` can show them beside ours.

Metric mapping on import: GenAI-Perf's and AIPerf's `inter_token_latency` is a per-request decode average
(our TPOT); AIPerf's `inter_chunk_latency` is the chunk-gap distribution (our ITL); `request_latency` is E2E.
"""

from __future__ import annotations

import csv
import json
import re
import shlex
from pathlib import Path

import numpy as np

from trtllm_forge.bench.stats import describe, scalar
from trtllm_forge.bench.workload import BenchRequest

EMITTERS = ("perf_analyzer", "genai-perf", "aiperf")

_NAME_MAP = {
    "time_to_first_token": "ttft_ms", "time_to_second_token": "ttst_ms", "inter_token_latency": "tpot_ms",
    "inter_chunk_latency": "itl_ms", "request_latency": "e2e_ms", "output_sequence_length": "output_tokens",
    "input_sequence_length": "input_tokens", "output_token_throughput_per_user": "per_user_output_tokens_per_s",
}
_SYSTEM_MAP = {"output_token_throughput": "output_token_throughput_per_s", "request_throughput": "request_throughput_per_s",
               "goodput": "goodput_per_s", "request_goodput": "goodput_per_s"}


def _host_port(url: str) -> str:
    return re.sub(r"^https?://", "", url).rstrip("/")


def emit(kind: str, requests: list[BenchRequest], out: Path, *, url: str, http_url: str | None, model: str,
         concurrency: list[int], rates: list[float], num_requests: int, tokenizer: Path | None, seed: int) -> dict:
    """Write the input file and the exact command lines for `kind`; return {files, commands}."""
    out.mkdir(parents=True, exist_ok=True)
    http = http_url or "http://127.0.0.1:8000"
    loads = [("concurrency", c) for c in concurrency] + [("rate", r) for r in rates] or [("concurrency", 1)]
    commands: list[list[str]] = []
    if kind == "perf_analyzer":
        data = {"data": [{"text_input": [r.prompt], "max_tokens": [r.output_tokens], "stream": [True],
                          "exclude_input_in_output": [True], "min_tokens": [r.output_tokens]} for r in requests]}
        path = out / "perf_analyzer_inputs.json"
        path.write_text(json.dumps(data) + "\n")
        for mode, value in loads:
            argv = ["perf_analyzer", "-m", model, "-u", _host_port(url), "-i", "grpc", "--async", "--streaming",
                    "--input-data", str(path), "--shape", "text_input:1", "--request-count", str(num_requests),
                    "--profile-export-file", str(out / f"pa_{mode}{value:g}.json")]
            argv += ["--concurrency-range", str(value)] if mode == "concurrency" else ["--request-rate-range", f"{value:g}", "--request-distribution", "poisson"]
            commands.append(argv)
    else:
        path = out / f"{kind.replace('-', '_')}_inputs.jsonl"
        key = "text" if kind == "genai-perf" else "text"
        with open(path, "w") as handle:
            for r in requests:
                row = {key: r.prompt, "output_length": r.output_tokens} if kind == "aiperf" else {key: r.prompt}
                handle.write(json.dumps(row) + "\n")
        osl = int(round(float(np.mean([r.output_tokens for r in requests]))))
        for mode, value in loads:
            load = ["--concurrency", str(value)] if mode == "concurrency" else ["--request-rate", f"{value:g}"]
            if kind == "genai-perf":
                argv = ["genai-perf", "profile", "-m", model, "--service-kind", "triton", "--backend", "tensorrtllm",
                        "-u", _host_port(url), "--streaming", "--input-file", str(path), "--output-tokens-mean", str(osl),
                        "--output-tokens-mean-deterministic", "--request-count", str(num_requests), "--random-seed", str(seed),
                        "--artifact-dir", str(out / f"genai_perf_{mode}{value:g}"), *load]
            else:
                template = '{"text_input": {{ text|tojson }}, "max_tokens": %d, "min_tokens": %d, "stream": true, "exclude_input_in_output": true}' % (osl, osl)
                argv = ["aiperf", "profile", "--model", model, "--url", http, "--endpoint-type", "template",
                        "--custom-endpoint", f"/v2/models/{model}/generate_stream", "--streaming",
                        "--extra-inputs", f"payload_template:{template}", "--extra-inputs", "response_field:text_output",
                        "--input-file", str(path), "--custom-dataset-type", "single_turn",
                        "--request-count", str(num_requests), "--random-seed", str(seed),
                        "--artifact-dir", str(out / f"aiperf_{mode}{value:g}"), *load]
            if tokenizer is not None:
                argv += ["--tokenizer", str(tokenizer)]
            commands.append(argv)
    script = out / f"run_{kind.replace('-', '_')}.sh"
    header = ("#!/bin/sh\n# Same workload as trtllm-forge bench; generated, not run here. The output length is forced with\n"
              "# min_tokens; if your model declares min_length instead, rename it. AIPerf speaks HTTP only: check its --url.\nset -e\n")
    script.write_text(header + "".join(shlex.join(c) + "\n" for c in commands))
    script.chmod(0o755)
    return {"tool": kind, "files": [str(path), str(script)], "commands": [shlex.join(c) for c in commands]}


# ---- import --------------------------------------------------------------------------------------------


def _stats(block: dict, unit: str) -> dict:
    out = describe([], unit)
    for key in ("avg", "min", "max", "std", *(f"p{p}" for p in (1, 5, 10, 25, 50, 75, 90, 95, 99))):
        if isinstance(block.get(key), (int, float)):
            out[key] = float(block[key])
    out["count"] = block.get("count", 1 if out["avg"] is not None else 0)
    return out


def _empty_summary(source: str, path: Path) -> dict:
    names = ["ttft_ms", "ttst_ms", "tpot_ms", "itl_ms", "e2e_ms", "output_tokens", "input_tokens", "per_user_output_tokens_per_s",
             "output_token_throughput_per_s", "request_throughput_per_s", "goodput_per_s"]
    return {"schema": "trtllm-forge.bench/1", "source": source, "imported_from": str(path),
            "metrics": {n: describe([], "ms") for n in names}, "requests": {"completed": None, "failed": None}, "load": {}}


def _from_aggregate_json(data: dict, source: str, path: Path) -> dict:
    summary = _empty_summary(source, path)
    blocks = data.get("records") if isinstance(data.get("records"), dict) else data
    for name, block in blocks.items():
        if not isinstance(block, dict):
            continue
        if name in _NAME_MAP:
            summary["metrics"][_NAME_MAP[name]] = _stats(block, block.get("unit", "ms"))
        elif name in _SYSTEM_MAP:
            summary["metrics"][_SYSTEM_MAP[name]] = _stats(block, block.get("unit", "per s"))
    for key, target in (("request_count", "completed"), ("error_request_count", "failed")):
        block = blocks.get(key)
        if isinstance(block, dict) and block.get("avg") is not None:
            summary["requests"][target] = int(block["avg"])
    config = data.get("input_config") or data.get("input_config_") or {}
    if isinstance(config, dict):
        load = config.get("perf_analyzer", {}).get("stimulus", {}) if "perf_analyzer" in config else {}
        load = load or {k: config.get(k) for k in ("concurrency", "request_rate") if config.get(k)}
        if load.get("concurrency"):
            summary["load"] = {"mode": "concurrency", "value": load["concurrency"]}
        elif load.get("request_rate"):
            summary["load"] = {"mode": "rate", "value": load["request_rate"]}
    return summary


def _norm(name: str) -> str:
    return re.sub(r"\s*\(.*\)\s*$", "", name).strip().lower().replace(" ", "_")


def _from_genai_perf_csv(path: Path) -> dict:
    summary = _empty_summary("genai-perf", path)
    header: list[str] | None = None
    with open(path, newline="") as handle:
        for row in csv.reader(handle):
            if not row or not any(row):
                header = None
                continue
            if row[0] == "Metric":
                header = row
                continue
            name = _norm(row[0])
            if header and len(header) > 2:
                block = {h: float(v.replace(",", "")) for h, v in zip(header[1:], row[1:]) if v not in ("", "N/A")}
                if name in _NAME_MAP:
                    summary["metrics"][_NAME_MAP[name]] = _stats(block, "ms")
            elif header and len(row) > 1:
                if name in _SYSTEM_MAP:
                    summary["metrics"][_SYSTEM_MAP[name]] = scalar(float(row[1].replace(",", "")), "per s")
                elif name == "request_count":
                    summary["requests"]["completed"] = int(float(row[1].replace(",", "")))
    return summary


def _from_aiperf_jsonl(path: Path) -> dict:
    summary = _empty_summary("aiperf", path)
    values: dict[str, list[float]] = {}
    starts, ends, failed, done, out_tokens = [], [], 0, 0, 0.0
    with open(path) as handle:
        for line in handle:
            if not line.strip():
                continue
            rec = json.loads(line)
            meta = rec.get("metadata") or {}
            if meta.get("benchmark_phase") not in (None, "profiling"):
                continue
            if rec.get("error"):
                failed += 1
                continue
            done += 1
            if meta.get("request_start_ns") is not None:
                starts.append(meta["request_start_ns"])
            if meta.get("request_end_ns") is not None:
                ends.append(meta["request_end_ns"])
            for tag, metric in (rec.get("metrics") or {}).items():
                value = metric.get("value") if isinstance(metric, dict) else metric
                key = _NAME_MAP.get(tag)
                if key is None or value is None:
                    continue
                values.setdefault(key, []).extend(value if isinstance(value, list) else [value])
                if tag == "output_sequence_length":
                    out_tokens += float(value)
    for key, vals in values.items():
        summary["metrics"][key] = describe(vals, "tokens" if key.endswith("tokens") else "ms")
    if starts and ends and max(ends) > min(starts):
        window = (max(ends) - min(starts)) / 1e9
        summary["metrics"]["request_throughput_per_s"] = scalar(done / window, "requests/s")
        summary["metrics"]["output_token_throughput_per_s"] = scalar(out_tokens / window, "tokens/s")
    summary["requests"] = {"completed": done, "failed": failed}
    return summary


def import_export(path: Path) -> dict | None:
    """Our summary schema from a GenAI-Perf or AIPerf export file, or a directory holding one."""
    path = Path(path)
    if path.is_dir():
        for name in ("profile_export_aiperf.json", "profile_export_genai_perf.json", "profile_export.jsonl", "profile_export_genai_perf.csv"):
            found = sorted(path.rglob(name))
            if found:
                return import_export(found[0])
        return None
    if path.name.endswith(".jsonl"):
        return _from_aiperf_jsonl(path)
    if path.suffix == ".csv":
        return _from_genai_perf_csv(path)
    if path.suffix == ".json":
        data = json.loads(path.read_text())
        source = "aiperf" if "aiperf" in path.name else "genai-perf"
        return _from_aggregate_json(data, source, path)
    return None
