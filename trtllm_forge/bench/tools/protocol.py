"""What every external load generator offers `bench --tool`, `bench --emit` and `bench import` (`BenchTool`), and
what passes between them: the workload a tool sends (`ToolWorkload`), one measured point (`PointRun`, `Measured`),
an export file as a reader sees it (`ExportFile`) and what a reader returns (`ImportedPoint`).

Kept light (stdlib only at import): the registry is read by the `bench` command's options, and `--help` must not
load numpy or tritonclient.
"""

from __future__ import annotations

import csv
import json
import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from trtllm_forge.bench.options import BenchOptions
    from trtllm_forge.bench.records import RequestRecord
    from trtllm_forge.bench.runner import LoadSpec
    from trtllm_forge.bench.workload import BenchRequest

# One request's inputs as our target sends them: (name, Triton datatype, values).
RequestInputs = list[tuple[str, str, list[Any]]]


@dataclass
class ToolWorkload:
    """One sweep point's requests with the exact inputs each sends, and where to send them."""

    model: str
    grpc_url: str  # host:port
    http_url: str | None
    requests: list[BenchRequest]
    inputs: list[RequestInputs]  # per request
    tokenizer: Path | None = None
    seed: int = 0
    notes: list[str] = field(default_factory=list)

    def constant(self, name: str) -> Any:
        """The value of an input that every request sends identically (None if absent or varying)."""
        values = {json.dumps(v) for spec in self.inputs for n, _, v in spec if n == name}
        return json.loads(values.pop())[0] if len(values) == 1 and all(any(n == name for n, _, _ in s) for s in self.inputs) else None

    def names(self) -> set[str]:
        return {name for spec in self.inputs for name, _, _ in spec}


def absolute(path: Path) -> str:
    """A path in a tool's command line, absolute: `bench --tool` runs the tool in its log's folder, a user runs an
    emitted command from anywhere, and a relative tokenizer directory that is not found there is taken for a Hugging
    Face repo id by GenAI-Perf and AIPerf ("Repo id must be in the form 'repo_name' or 'namespace/repo_name'")."""
    return str(Path(path).resolve())


def host_port(url: str) -> str:
    return re.sub(r"^(https?|grpc)://", "", url).rstrip("/")


def load_flags(load: LoadSpec) -> list[str]:
    """GenAI-Perf's and AIPerf's flags for a sweep point (both spell them the same)."""
    return ["--concurrency", str(int(load.value))] if load.mode == "concurrency" else ["--request-rate", f"{load.value:g}"]


@dataclass(frozen=True)
class Executable:
    """A tool's executable on this machine and the environment to run it in."""

    path: str
    env: dict[str, str]


@dataclass(frozen=True)
class PointRun:
    """One sweep point of `bench --tool`: what to send, with which executable, where its files go."""

    executable: Executable
    workload: ToolWorkload
    warmup: ToolWorkload | None  # the warm-up requests, sent first and not measured
    load: LoadSpec
    count: int  # measured requests
    work: Path  # the tool's folder: inputs, export, logs
    log: Path
    timeout_s: float  # a stuck tool must not hang the run


@dataclass(frozen=True)
class Measured:
    argv: list[str]  # the measured run's command line
    export: Path  # its export (a file, or the folder `bench import` searches)


@dataclass
class ImportedPoint:
    summary: dict[str, Any]
    records: list[RequestRecord] | None = None  # per-request records, when the export has per-response timestamps


class ExportProblem(Exception):
    """A reader took the file for its tool's but cannot read it; `bench import` names the file (exit 2)."""


class ExportFile:
    """An export's text as the readers see it: parsed as JSON when it looks like JSON, else as CSV rows."""

    def __init__(self, path: Path, text: str):
        self.path = path
        self.text = text

    @cached_property
    def json_like(self) -> bool:
        return self.text.lstrip().startswith("{")

    @cached_property
    def document(self) -> dict[str, Any] | None:
        """The JSON object, or None when the text is not one (JSONL, CSV, broken JSON)."""
        if not self.json_like:
            return None
        try:
            data = json.loads(self.text)
        except json.JSONDecodeError:
            return None
        return data if isinstance(data, dict) else None

    @cached_property
    def rows(self) -> list[list[str]]:
        return [] if self.json_like else list(csv.reader(self.text.splitlines()))

    @cached_property
    def csv_header(self) -> str | None:
        """The first cell of the first non-blank CSV row ("Metric", "Config Name", ...)."""
        first = next((row for row in self.rows if any(cell.strip() for cell in row)), None)
        return first[0].strip() if first else None


class BenchTool(Protocol):
    """An external load generator. Add one: a module under bench/tools/ with a class like these, one line in
    registry.TOOLS."""

    @property
    def name(self) -> str:
        """The `--tool` / `--emit` value and the `source` of its summaries."""
        ...

    @property
    def targets(self) -> tuple[str, ...]:
        """The bench targets it can drive (`--target`); the first is the one suggested."""
        ...

    @property
    def runs(self) -> tuple[str, ...]:
        """Other tools it runs itself (their exports land in its artifact folder too)."""
        ...

    @property
    def export_files(self) -> tuple[str, ...]:
        """The files it writes that `bench import` finds in a folder, best first."""
        ...

    @property
    def export_formats(self) -> tuple[str, ...]:
        """The formats its reader knows, named in the error for an unknown file."""
        ...

    @property
    def emitted_inputs(self) -> str:
        """The input file's name in `--emit`'s folder."""
        ...

    def executable(self) -> Executable:
        """The executable to run and its environment; StepError when it is not installed or cannot run."""
        ...

    def emit_options(self, options: BenchOptions) -> BenchOptions:
        """`options` as `--emit` writes this tool's commands for (ConfigError when it cannot)."""
        ...

    def write_inputs(self, workload: ToolWorkload, path: Path) -> Path:
        """Write the workload's input file for this tool at `path`."""
        ...

    def argv(self, binary: str, workload: ToolWorkload, inputs: Path, load: LoadSpec, count: int, export: Path) -> list[str]:
        """The command line of one sweep point (every path absolute); ConfigError when the tool cannot run it."""
        ...

    def emitted_export(self, label: str) -> str:
        """The export's name in `--emit`'s folder for the point labelled `label`."""
        ...

    def measure(self, run: PointRun) -> Measured:
        """`bench --tool`: write the inputs, run the warm-up (if the tool has one) and the point; StepError if it fails."""
        ...

    def read_export(self, export: ExportFile, tokenizer: Any) -> list[ImportedPoint] | None:
        """The sweep points of `export` if it is one of this tool's formats, else None (ExportProblem if it is but
        cannot be read)."""
        ...
