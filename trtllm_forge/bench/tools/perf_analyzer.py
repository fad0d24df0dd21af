"""NVIDIA's perf_analyzer as a bench tool: streaming over gRPC (the models are decoupled), asynchronous, exactly
the requested count, our inputs per request in its `--input-data` JSON; its raw profile export is read by
perf_analyzer_export.py. Where the binary is and how `make setup` installs it: bench/perf_analyzer.py.

perf_analyzer 2.51 has no warm-up option: warm-up requests go in a separate, unexported run first.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtllm_forge.bench.perf_analyzer import find_perf_analyzer, problem
from trtllm_forge.bench.tools.process import run_logged
from trtllm_forge.bench.tools.protocol import (
    Executable,
    ExportFile,
    ImportedPoint,
    Measured,
    PointRun,
    ToolWorkload,
    absolute,
    host_port,
)
from trtllm_forge.errors import ConfigError, StepError
from trtllm_forge.ui import info

if TYPE_CHECKING:
    from trtllm_forge.bench.options import BenchOptions
    from trtllm_forge.bench.runner import LoadSpec

ARRIVALS = ("poisson", "constant")  # perf_analyzer's --request-distribution

# perf_analyzer 2.51 ends with this error (exit 99) when the server's statistics of the model did not move between
# its two snapshots around the measurement: a race on a busy server with few requests, after every request was
# answered (InferenceProfiler::DetermineStatsModelVersion; triton-inference-server/client PR #437 proposed making
# it a warning). The warm-up's requests are done by then; a measured run is run again.
PA_STATS_RACE = "failed to find the requested model version"
# Seen twice in full test runs (2026-12-03, the token-id point at concurrency 2 on a server's first requests, a busy
# machine): exit 0, its console report complete, the profile export empty. Its exporter (triton-inference-server/
# client, src/profile_data_exporter.cc, OutputToFile) truncates the file, then writes through rapidjson's 64 KiB
# FileWriteStream, flushed when the document ends: a document that stops short leaves an empty file and no error.
# What stopped it was not found (not reproduced in 66 runs outside the suite, 45 beside three busy loops, 11 on a
# fresh server); a measured point is run again.
PA_EMPTY_EXPORT = "an empty profile export after exiting 0"
PA_ATTEMPTS = 3


class PerfAnalyzer:
    name = "perf_analyzer"
    targets = ("triton-grpc", "triton-grpc-tokens")
    runs: tuple[str, ...] = ()
    export_files = ("profile_export.json",)
    export_formats = ("perf_analyzer profile_export.json",)
    emitted_inputs = "perf_analyzer_inputs.json"

    def executable(self) -> Executable:
        why = problem()
        if why:
            raise StepError("perf_analyzer", why)
        found = find_perf_analyzer()
        assert found is not None  # problem() is None only for a perf_analyzer it found
        return Executable(str(found.binary), found.env())

    def emit_options(self, options: BenchOptions) -> BenchOptions:
        return options

    def write_inputs(self, workload: ToolWorkload, path: Path) -> Path:
        """PA's --input-data JSON: one entry per request, every tensor with its content and shape."""
        rows = [{name: {"content": values, "shape": [len(values)]} for name, _, values in spec} for spec in workload.inputs]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"data": rows}) + "\n")
        return path

    def argv(self, binary: str, workload: ToolWorkload, inputs: Path, load: LoadSpec, count: int, export: Path | None) -> list[str]:
        """Without `export`: a run that writes no profile export (the warm-up)."""
        if load.mode == "rate" and load.arrival not in ARRIVALS:
            raise ConfigError("--arrival", f"perf_analyzer has no {load.arrival!r} arrivals", "use --arrival poisson or constant")
        if count < load.value:  # perf_analyzer refuses a request count below the concurrency or the rate
            raise ConfigError(
                "--num-requests",
                f"perf_analyzer needs at least {load.value:g} requests at {load.label}",
                f"give --num-requests {int(-(-load.value // 1))} or more",
            )
        argv = [
            binary,
            "-m",
            workload.model,
            "-u",
            host_port(workload.grpc_url),
            "-i",
            "grpc",
            "--async",
            "--streaming",
            "--input-data",
            absolute(inputs),
            "--request-count",
            str(count),
        ]
        if load.mode == "concurrency":
            argv += ["--concurrency-range", str(int(load.value))]
        else:
            argv += ["--request-rate-range", f"{load.value:g}", "--request-distribution", load.arrival]
        if export is not None:
            argv += ["--profile-export-file", absolute(export)]
        return argv

    def emitted_export(self, label: str) -> str:
        return f"pa_{label}.json"

    def measure(self, run: PointRun) -> Measured:
        binary, env = run.executable.path, run.executable.env
        if run.warmup is not None:
            inputs = self.write_inputs(run.warmup, run.work / "warmup_inputs.json")
            count = len(run.warmup.requests)
            warm_load = replace(run.load, value=min(run.load.value, count)) if run.load.mode == "concurrency" else run.load
            warm_argv = self.argv(binary, run.warmup, inputs, warm_load, count, None)
            run_perf_analyzer(warm_argv, env, run.work / "warmup.log", run.timeout_s, warmup=True)
        inputs = self.write_inputs(run.workload, run.work / "inputs.json")
        export = run.work / "profile_export.json"
        argv = self.argv(binary, run.workload, inputs, run.load, run.count, export)
        run_perf_analyzer(argv, env, run.log, run.timeout_s, warmup=False, export=export)
        return Measured(argv, export)

    def read_export(self, export: ExportFile, tokenizer: Any) -> list[ImportedPoint] | None:
        document = export.document
        if document is None or not isinstance(document.get("experiments"), list):
            return None
        from trtllm_forge.bench.tools.perf_analyzer_export import points_from_profile_export

        return points_from_profile_export(document, export.path, tokenizer)


def run_perf_analyzer(
    argv: list[str], env: dict[str, str], log: Path, timeout_s: float, *, warmup: bool, export: Path | None = None
) -> None:
    """Run perf_analyzer once more (up to PA_ATTEMPTS in all, each failed attempt's log kept) after its statistics
    race or an empty `export`; a warm-up (no export) goes on after the race."""
    for attempt in range(1, PA_ATTEMPTS + 1):
        try:
            run_logged(argv, env, log, timeout_s)
        except StepError:
            if PA_STATS_RACE not in log.read_text(errors="replace"):
                raise
            if warmup:
                info(f"perf_analyzer's warm-up: {PA_STATS_RACE!r} after its requests were answered; going on")
                return
            if attempt == PA_ATTEMPTS:
                raise
            happened = f"{PA_STATS_RACE!r} (its statistics race)"
        else:
            if export is None or (export.is_file() and export.stat().st_size > 0):
                return
            if attempt == PA_ATTEMPTS:
                raise StepError("perf_analyzer", f"{PA_EMPTY_EXPORT} ({export}), {attempt} times", f"see {log}")
            happened = PA_EMPTY_EXPORT
        kept = log.with_name(f"{log.stem}.attempt{attempt}{log.suffix}")
        log.replace(kept)
        if export is not None and export.exists():  # perf_analyzer refuses an export path that exists
            export.replace(export.with_name(f"{export.stem}.attempt{attempt}{export.suffix}"))
        info(f"perf_analyzer: {happened}, log kept in {kept}; running the point again")
