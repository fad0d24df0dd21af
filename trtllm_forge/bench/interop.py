"""Interop with other load generators: the same workload as our bench, written for perf_analyzer, GenAI-Perf
and AIPerf (the input files and exact command lines of `--emit`, and what `bench --tool` runs). Reading
their exports is exports.py's job.

The inputs of each request are the ones our gRPC target sends (`request_inputs`: only what the model
declares; the output length forced with min_tokens, else min_length, else an unreachable end_id).
GenAI-Perf: 0.0.13+ takes `--endpoint-type kserve --backend tensorrtllm` (not `--service-kind triton`);
its `--output-tokens-mean-deterministic` sends `min_length`, which the TensorRT-LLM ensemble does not declare,
so the forced length goes in as `--extra-inputs min_tokens:N` (GenAI-Perf's `subcommand/common.py` turns
digits into an int; its tensorrtllm converter adds extra inputs to every payload).
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from trtllm_forge.bench.runner import LoadSpec
from trtllm_forge.bench.target import UNREACHABLE_END_ID
from trtllm_forge.bench.workload import BenchRequest
from trtllm_forge.errors import ConfigError

EMITTERS = ("perf_analyzer", "genai-perf", "aiperf")
PA_ARRIVALS = ("poisson", "constant")  # perf_analyzer's --request-distribution


@dataclass
class ToolWorkload:
    """One sweep point's requests with the exact inputs each sends, and where to send them."""

    model: str
    grpc_url: str  # host:port
    http_url: str | None
    requests: list[BenchRequest]
    inputs: list[list[tuple[str, str, list]]]  # per request: (name, Triton datatype, values)
    tokenizer: Path | None = None
    seed: int = 0
    notes: list[str] = field(default_factory=list)

    def constant(self, name: str):
        """The value of an input that every request sends identically (None if absent or varying)."""
        values = {json.dumps(v) for spec in self.inputs for n, _, v in spec if n == name}
        return json.loads(values.pop())[0] if len(values) == 1 and all(any(n == name for n, _, _ in s) for s in self.inputs) else None

    def names(self) -> set[str]:
        return {name for spec in self.inputs for name, _, _ in spec}


def _abs(path: Path) -> str:
    """A path in a tool's command line, absolute: `bench --tool` runs the tool in its log's folder, a user runs an
    emitted command from anywhere, and a relative tokenizer directory that is not found there is taken for a Hugging
    Face repo id by GenAI-Perf and AIPerf ("Repo id must be in the form 'repo_name' or 'namespace/repo_name'")."""
    return str(Path(path).resolve())


def host_port(url: str) -> str:
    return re.sub(r"^(https?|grpc)://", "", url).rstrip("/")


def _label(load: LoadSpec) -> str:
    return load.label


# ---- perf_analyzer ---------------------------------------------------------------------------------------


def write_perf_analyzer_inputs(workload: ToolWorkload, path: Path) -> Path:
    """PA's --input-data JSON: one entry per request, every tensor with its content and shape."""
    rows = [{name: {"content": values, "shape": [len(values)]} for name, _, values in spec} for spec in workload.inputs]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"data": rows}) + "\n")
    return path


def perf_analyzer_argv(binary: str, workload: ToolWorkload, inputs: Path, load: LoadSpec, count: int, export: Path | None) -> list[str]:
    """Streaming over gRPC (the models are decoupled), asynchronous, exactly `count` requests."""
    if load.mode == "rate" and load.arrival not in PA_ARRIVALS:
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
        _abs(inputs),
        "--request-count",
        str(count),
    ]
    if load.mode == "concurrency":
        argv += ["--concurrency-range", str(int(load.value))]
    else:
        argv += ["--request-rate-range", f"{load.value:g}", "--request-distribution", load.arrival]
    if export is not None:
        argv += ["--profile-export-file", _abs(export)]
    return argv


# ---- GenAI-Perf ------------------------------------------------------------------------------------------


def write_prompts_jsonl(workload: ToolWorkload, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"text": r.prompt}) + "\n" for r in workload.requests))
    return path


def _pa_warmup(warmup: int, load: LoadSpec) -> int:
    """perf_analyzer 2.51 never finishes a warm-up of fewer requests than the concurrency (seen: GenAI-Perf at
    concurrency 16 with 4 warm-up requests hung): at least one request per slot, or none."""
    return max(warmup, int(load.value)) if warmup and load.mode == "concurrency" else warmup


def genai_perf_argv(
    executable: str, workload: ToolWorkload, prompts: Path, load: LoadSpec, count: int, artifact_dir: Path, warmup: int = 0
) -> list[str]:
    lengths = {r.output_tokens for r in workload.requests}
    if len(lengths) != 1:
        raise ConfigError(
            "--output-len", "GenAI-Perf sends one forced output length for every request", "give a fixed --output-len N for genai-perf"
        )
    osl = lengths.pop()
    argv = [
        executable,
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
        _abs(prompts),
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
        _abs(artifact_dir),
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
        argv += ["--tokenizer", _abs(workload.tokenizer)]
    argv += ["--concurrency", str(int(load.value))] if load.mode == "concurrency" else ["--request-rate", f"{load.value:g}"]
    return argv


# ---- AIPerf ----------------------------------------------------------------------------------------------


def write_aiperf_inputs(workload: ToolWorkload, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"text": r.prompt, "output_length": r.output_tokens}) + "\n" for r in workload.requests))
    return path


def aiperf_argv(executable: str, workload: ToolWorkload, prompts: Path, load: LoadSpec, count: int, artifact_dir: Path) -> list[str]:
    """AIPerf speaks HTTP: Triton's generate_stream through its template endpoint; each request's output length
    comes from the input file (`output_length` → the template's `max_tokens`), forced like ours."""
    http = workload.http_url or "http://127.0.0.1:8000"
    fields = {"text_input": "{{ text|tojson }}", "max_tokens": "{{ max_tokens }}"}
    for name in sorted(workload.names() - {"text_input", "max_tokens"}):
        value = workload.constant(name)
        fields[name] = "{{ max_tokens }}" if name in ("min_tokens", "min_length") else json.dumps(value)
    # In a file: AIPerf splits an inline --extra-inputs value at its commas.
    template = prompts.with_name(prompts.stem + "_payload.jinja")
    template.write_text("{" + ", ".join(f'"{k}": {v}' for k, v in fields.items()) + "}\n")
    argv = [
        executable,
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
        f"payload_template:{_abs(template)}",
        "--extra-inputs",
        "response_field:text_output",
        "--input-file",
        _abs(prompts),
        "--custom-dataset-type",
        "single_turn",
        "--request-count",
        str(count),
        "--random-seed",
        str(workload.seed),
        "--artifact-dir",
        _abs(artifact_dir),
    ]
    if workload.tokenizer is not None:
        argv += ["--tokenizer", _abs(workload.tokenizer)]
    argv += ["--concurrency", str(int(load.value))] if load.mode == "concurrency" else ["--request-rate", f"{load.value:g}"]
    return argv


# ---- --emit ----------------------------------------------------------------------------------------------


def emit(kind: str, workload: ToolWorkload, loads: list[LoadSpec], count: int, out: Path) -> dict:
    """Write the input file and a script of the exact command lines for `kind`; return {tool, files, commands}."""
    out.mkdir(parents=True, exist_ok=True)
    commands: list[list[str]] = []
    if kind == "perf_analyzer":
        path = write_perf_analyzer_inputs(workload, out / "perf_analyzer_inputs.json")
        commands = [perf_analyzer_argv("perf_analyzer", workload, path, load, count, out / f"pa_{_label(load)}.json") for load in loads]
    elif kind == "genai-perf":
        path = write_prompts_jsonl(workload, out / "genai_perf_inputs.jsonl")
        commands = [genai_perf_argv("genai-perf", workload, path, load, count, out / f"genai_perf_{_label(load)}") for load in loads]
    else:
        path = write_aiperf_inputs(workload, out / "aiperf_inputs.jsonl")
        commands = [aiperf_argv("aiperf", workload, path, load, count, out / f"aiperf_{_label(load)}") for load in loads]
    script = out / f"run_{kind.replace('-', '_')}.sh"
    notes = "".join(f"# {note}\n" for note in workload.notes)
    header = f"#!/bin/sh\n# Same workload as trtllm-forge bench (`bench --tool` runs these and imports the exports).\n{notes}set -e\n"
    script.write_text(header + "".join(shlex.join(c) + "\n" for c in commands))
    script.chmod(0o755)
    return {"tool": kind, "files": [str(path), str(script)], "commands": [shlex.join(c) for c in commands], "argv": commands}
