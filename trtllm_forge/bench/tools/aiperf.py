"""NVIDIA's AIPerf as a bench tool (installed in its own venv: $FORGE_AIPERF or `aiperf` on PATH).

AIPerf speaks HTTP: Triton's generate_stream through its template endpoint; each request's output length comes
from the input file (`output_length` → the template's `max_tokens`), forced like ours. It gets no warm-up here.

Exports read: the aggregate `profile_export_aiperf.json` (both schemas) and `.csv` (aggregate_exports.py), and the
per-request `profile_export.jsonl` (both metadata schemas: `benchmark_phase`/`request_start_ns` and the older
`credit_phase`/`timestamp_ns`), pooled and summarised here.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtllm_forge import third_party_env
from trtllm_forge.bench.tools.process import installed, run_logged
from trtllm_forge.bench.tools.protocol import (
    Executable,
    ExportFile,
    ExportProblem,
    ImportedPoint,
    Measured,
    PointRun,
    ToolWorkload,
    absolute,
    load_flags,
)

if TYPE_CHECKING:
    from trtllm_forge.bench.options import BenchOptions
    from trtllm_forge.bench.runner import LoadSpec

ENV_VAR = "FORGE_AIPERF"  # path of the executable
DEFAULT_HTTP_URL = "http://127.0.0.1:8000"  # Triton's HTTP port, when the deployment's HTTP URL is not known


class AIPerf:
    name = "aiperf"
    targets = ("triton-http",)
    runs: tuple[str, ...] = ()
    export_files = ("profile_export_aiperf.json", "profile_export.jsonl", "profile_export_aiperf.csv")
    export_formats = ("AIPerf profile_export_aiperf.json/.csv (both schemas)", "AIPerf profile_export.jsonl")
    emitted_inputs = "aiperf_inputs.jsonl"

    def executable(self) -> Executable:
        return Executable(installed(self.name, ENV_VAR), third_party_env())

    def emit_options(self, options: BenchOptions) -> BenchOptions:
        """The same workload over HTTP: the deployment's HTTP URL instead of its gRPC one."""
        if options.target.startswith("triton-grpc"):
            return replace(options, target="triton-http", url=options.http_url or DEFAULT_HTTP_URL)
        return options

    def write_inputs(self, workload: ToolWorkload, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps({"text": r.prompt, "output_length": r.output_tokens}) + "\n" for r in workload.requests))
        return path

    def argv(self, binary: str, workload: ToolWorkload, inputs: Path, load: LoadSpec, count: int, export: Path) -> list[str]:
        """`export` is AIPerf's artifact folder. Writes the payload template beside `inputs`."""
        http = workload.http_url or DEFAULT_HTTP_URL
        fields = {"text_input": "{{ text|tojson }}", "max_tokens": "{{ max_tokens }}"}
        for name in sorted(workload.names() - {"text_input", "max_tokens"}):
            value = workload.constant(name)
            fields[name] = "{{ max_tokens }}" if name in ("min_tokens", "min_length") else json.dumps(value)
        # In a file: AIPerf splits an inline --extra-inputs value at its commas.
        template = inputs.with_name(inputs.stem + "_payload.jinja")
        template.write_text("{" + ", ".join(f'"{k}": {v}' for k, v in fields.items()) + "}\n")
        argv = [
            binary,
            "profile",
            "--model",
            workload.model,
            "--url",
            http,
            "--endpoint-type",
            "template",
            "--custom-endpoint",
            f"/v2/models/{workload.model}/generate_stream",
            "--streaming",
            "--extra-inputs",
            f"payload_template:{absolute(template)}",
            "--extra-inputs",
            "response_field:text_output",
            "--input-file",
            absolute(inputs),
            "--custom-dataset-type",
            "single_turn",
            "--request-count",
            str(count),
            "--random-seed",
            str(workload.seed),
            "--artifact-dir",
            absolute(export),
        ]
        if workload.tokenizer is not None:
            argv += ["--tokenizer", absolute(workload.tokenizer)]
        return argv + load_flags(load)

    def emitted_export(self, label: str) -> str:
        return f"aiperf_{label}"

    def measure(self, run: PointRun) -> Measured:
        prompts = self.write_inputs(run.workload, run.work / "prompts.jsonl")
        artifacts = run.work / "artifacts"
        argv = self.argv(run.executable.path, run.workload, prompts, run.load, run.count, artifacts)
        run_logged(argv, run.executable.env, run.log, run.timeout_s)
        return Measured(argv, artifacts)

    def read_export(self, export: ExportFile, tokenizer: Any) -> list[ImportedPoint] | None:
        from trtllm_forge.bench.tools import aggregate_exports as shared

        document = export.document
        if document is None:
            if export.json_like and _looks_like_jsonl(export.text):
                return [ImportedPoint(_from_jsonl(export.path, export.text))]
            if export.csv_header == "Metric" and shared.written_by_aiperf(export):
                return [ImportedPoint(shared.from_profile_csv(export.rows, self.name, export.path))]
            return None
        if isinstance(document.get("records"), dict):
            return [ImportedPoint(shared.from_aggregate_json(document["records"], document, self.name, export.path))]
        if "metadata" in document and "metrics" in document:  # a one-line JSONL
            return [ImportedPoint(_from_jsonl(export.path, export.text))]
        if shared.has_metric_names(document) and shared.written_by_aiperf(export):
            return [ImportedPoint(shared.from_aggregate_json(document, document, self.name, export.path))]
        return None


def _looks_like_jsonl(text: str) -> bool:
    try:
        first = json.loads(text.lstrip().splitlines()[0])
    except (json.JSONDecodeError, IndexError):
        return False
    return isinstance(first, dict) and "metrics" in first


def _first_given(*values: Any) -> Any:
    return next((v for v in values if v is not None), None)


def _from_jsonl(path: Path, text: str) -> dict[str, Any]:
    """AIPerf's per-request records: per-request values are pooled and summarised here; the window runs from
    the first request start to the last response."""
    from trtllm_forge.bench.stats import describe, scalar
    from trtllm_forge.bench.tools.aggregate_exports import STAT_NAMES, empty_summary

    summary = empty_summary("aiperf", path)
    values: dict[str, list[float]] = {}
    starts: list[float] = []
    ends: list[float] = []
    failed, done, out_tokens = 0, 0, 0.0
    for line_number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            raise ExportProblem(f"line {line_number} is not JSON") from None
        meta = record.get("metadata") or {}
        if (meta.get("benchmark_phase") or meta.get("credit_phase") or "profiling") != "profiling":
            continue
        if record.get("error") or meta.get("error"):
            failed += 1
            continue
        done += 1
        metrics = record.get("metrics") or {}

        def value_of(tag: str, metrics: dict[str, Any] = metrics) -> Any:
            metric = metrics.get(tag)
            return metric.get("value") if isinstance(metric, dict) else metric

        start = _first_given(meta.get("request_start_ns"), value_of("min_request_timestamp"), meta.get("timestamp_ns"))
        end = _first_given(meta.get("request_end_ns"), value_of("max_response_timestamp"))
        if end is None and start is not None and value_of("request_latency") is not None:
            end = start + value_of("request_latency") * 1e6
        if start is not None:
            starts.append(start)
        if end is not None:
            ends.append(end)
        for tag in metrics:
            key, value = STAT_NAMES.get(tag), value_of(tag)
            if key is None or value is None:
                continue
            values.setdefault(key, []).extend(value if isinstance(value, list) else [value])
            if key == "output_tokens":
                out_tokens += float(value)
    for key, vals in values.items():
        summary["metrics"][key] = describe(vals, "tokens" if key.endswith("tokens") else "ms")
    if starts and ends and max(ends) > min(starts):
        window = (max(ends) - min(starts)) / 1e9
        summary["metrics"]["request_throughput_per_s"] = scalar(done / window, "requests/s")
        summary["metrics"]["output_token_throughput_per_s"] = scalar(out_tokens / window, "tokens/s")
    summary["requests"] = {"sent": done + failed, "completed": done, "failed": failed}
    return summary
