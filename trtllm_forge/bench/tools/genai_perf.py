"""NVIDIA's GenAI-Perf as a bench tool (installed in its own venv: $FORGE_GENAI_PERF or `genai-perf` on PATH).

It drives the text contract (the ensemble) over gRPC and runs perf_analyzer itself, from PATH: ours (the wrapper
`make setup` writes in this venv's bin) goes first. GenAI-Perf 0.0.13+ takes `--endpoint-type kserve --backend
tensorrtllm` (not `--service-kind triton`); its `--output-tokens-mean-deterministic` sends `min_length`, which the
TensorRT-LLM ensemble does not declare, so the forced length goes in as `--extra-inputs min_tokens:N` (GenAI-Perf's
`subcommand/common.py` turns digits into an int; its tensorrtllm converter adds extra inputs to every payload).

Exports read: `profile_export_genai_perf.json` and `.csv` (aggregate_exports.py) and the `analyze` sweep CSV
(`analyze_export_genai_perf.csv`: one point per row, p99s and averages only).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtllm_forge import third_party_env
from trtllm_forge.bench.perf_analyzer import find_perf_analyzer
from trtllm_forge.bench.tools.process import installed, run_logged
from trtllm_forge.bench.tools.protocol import (
    Executable,
    ExportFile,
    ImportedPoint,
    Measured,
    PointRun,
    ToolWorkload,
    absolute,
    host_port,
    load_flags,
)
from trtllm_forge.errors import ConfigError

if TYPE_CHECKING:
    from trtllm_forge.bench.options import BenchOptions
    from trtllm_forge.bench.runner import LoadSpec

ENV_VAR = "FORGE_GENAI_PERF"  # path of the executable


class GenAIPerf:
    name = "genai-perf"
    targets = ("triton-grpc",)
    runs = ("perf_analyzer",)
    export_files = ("profile_export_genai_perf.json", "profile_export_genai_perf.csv", "analyze_export_genai_perf.csv")
    export_formats = ("GenAI-Perf profile_export_genai_perf.json/.csv", "GenAI-Perf analyze_export_genai_perf.csv")
    emitted_inputs = "genai_perf_inputs.jsonl"

    def executable(self) -> Executable:
        path = installed(self.name, ENV_VAR)
        pa = find_perf_analyzer()
        if pa is None:
            return Executable(path, third_party_env())
        env = pa.env()
        env["PATH"] = os.pathsep.join([str(Path(sys.prefix) / "bin"), env.get("PATH", "")])
        return Executable(path, env)

    def emit_options(self, options: BenchOptions) -> BenchOptions:
        if options.target == "triton-grpc-tokens":
            raise ConfigError("--emit genai-perf", "GenAI-Perf drives the text contract (ensemble) here", "use --target triton-grpc")
        return options

    def write_inputs(self, workload: ToolWorkload, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps({"text": r.prompt}) + "\n" for r in workload.requests))
        return path

    def argv(
        self, binary: str, workload: ToolWorkload, inputs: Path, load: LoadSpec, count: int, export: Path, warmup: int = 0
    ) -> list[str]:
        """`export` is GenAI-Perf's artifact folder; `warmup` requests are sent before the measured ones."""
        from trtllm_forge.bench.target import UNREACHABLE_END_ID

        lengths = {r.output_tokens for r in workload.requests}
        if len(lengths) != 1:
            raise ConfigError(
                "--output-len", "GenAI-Perf sends one forced output length for every request", "give a fixed --output-len N for genai-perf"
            )
        osl = lengths.pop()
        argv = [
            binary,
            "profile",
            "-m",
            workload.model,
            "--endpoint-type",
            "kserve",
            "--backend",
            "tensorrtllm",
            "-u",
            host_port(workload.grpc_url),
            "--streaming",
            "--input-file",
            absolute(inputs),
            "--num-dataset-entries",
            str(len(workload.requests)),
            "--output-tokens-mean",
            str(osl),
            "--request-count",
            str(count),
            "--warmup-request-count",
            str(_pa_warmup(warmup, load)),
            "--random-seed",
            str(workload.seed),
            "--artifact-dir",
            absolute(export),
        ]
        for name in ("min_tokens", "min_length"):
            if name in workload.names():
                argv += ["--extra-inputs", f"{name}:{osl}"]
                break
        if "end_id" in workload.names():
            argv += ["--extra-inputs", f"end_id:{UNREACHABLE_END_ID}"]
        if "return_num_output_tokens" in workload.names():
            argv += ["--extra-inputs", "return_num_output_tokens:true"]
        if workload.tokenizer is not None:
            argv += ["--tokenizer", absolute(workload.tokenizer)]
        return argv + load_flags(load)

    def emitted_export(self, label: str) -> str:
        return f"genai_perf_{label}"

    def measure(self, run: PointRun) -> Measured:
        prompts = self.write_inputs(run.workload, run.work / "prompts.jsonl")
        artifacts = run.work / "artifacts"
        warmup = len(run.warmup.requests) if run.warmup else 0
        argv = self.argv(run.executable.path, run.workload, prompts, run.load, run.count, artifacts, warmup)
        run_logged(argv, run.executable.env, run.log, run.timeout_s)
        return Measured(argv, artifacts)

    def read_export(self, export: ExportFile, tokenizer: Any) -> list[ImportedPoint] | None:
        from trtllm_forge.bench.tools import aggregate_exports as shared

        if export.csv_header == "Config Name":
            return _from_analyze_csv(export.rows, export.path)
        if shared.written_by_aiperf(export):
            return None
        document = export.document
        if document is not None:
            if not shared.has_metric_names(document):
                return None
            return [ImportedPoint(shared.from_aggregate_json(document, document, self.name, export.path))]
        if export.csv_header == "Metric":
            return [ImportedPoint(shared.from_profile_csv(export.rows, self.name, export.path))]
        return None


def _pa_warmup(warmup: int, load: LoadSpec) -> int:
    """perf_analyzer 2.51 never finishes a warm-up of fewer requests than the concurrency (seen: GenAI-Perf at
    concurrency 16 with 4 warm-up requests hung): at least one request per slot, or none."""
    return max(warmup, int(load.value)) if warmup and load.mode == "concurrency" else warmup


_ANALYZE_COLUMNS = {  # analyze CSV column (normalised) -> (our metric, statistic)
    "p99_time_to_first_token": ("ttft_ms", "p99"),
    "p99_inter_token_latency": ("tpot_ms", "p99"),
    "p99_request_latency": ("e2e_ms", "p99"),
    "p99_output_sequence_length": ("output_tokens", "p99"),
    "p99_input_sequence_length": ("input_tokens", "p99"),
    "p99_time_to_second_token": ("ttst_ms", "p99"),
    "avg._output_token_throughput": ("output_token_throughput_per_s", "avg"),
    "request_throughput": ("request_throughput_per_s", "avg"),
}


def _from_analyze_csv(rows: list[list[str]], path: Path) -> list[ImportedPoint]:
    """`genai-perf analyze`: the first table has one run (config) per row; the GPU table after the blank line is skipped."""
    from trtllm_forge.bench.tools.aggregate_exports import column_name, empty_summary, number

    points: list[ImportedPoint] = []
    header: list[str] | None = None
    for row in rows:
        if not row or not any(cell.strip() for cell in row):
            if points:
                break
            continue
        if row[0].strip() == "Config Name":
            header = [column_name(cell) for cell in row]
            continue
        if header is None:
            continue
        cells = dict(zip(header, row, strict=False))
        summary = empty_summary("genai-perf", path)
        summary["config_name"] = row[0].strip()
        for column, (metric, stat) in _ANALYZE_COLUMNS.items():
            value = number(cells.get(column))
            if value is not None:
                summary["metrics"][metric][stat] = value
                summary["metrics"][metric]["count"] = 1
        for column, mode in (("concurrency", "concurrency"), ("request_rate", "rate")):
            value = number(cells.get(column))
            if value is not None:
                summary["load"] = {"mode": mode, "value": int(value) if mode == "concurrency" else value}
                break
        for column, key in (("isl", "input_tokens_mean"), ("num_prompts", "num_prompts")):
            value = number(cells.get(column))
            if value is not None:
                summary.setdefault("workload", {})[key] = value
        points.append(ImportedPoint(summary))
    return points
