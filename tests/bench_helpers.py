"""What the bench tests (test_bench*.py, test_nvidia_clients.py) share: running `bench` through the CLI (a real
process, or in this one when nothing is measured), reading its JSON document and records, and driving a run
that a test interrupts. The options come from bench_support.cli_argv, which the fidelity script uses.
The shared timing-model server is conftest's `timing_triton` (its schedule: TTFT_MS, GAP_MS)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from bench_support.cli_argv import bench_argv, bench_options
from cli_inprocess import run_in_process
from conftest import TIMING_GAP_MS, TIMING_TTFT_MS, run_cli

TTFT_MS, GAP_MS = TIMING_TTFT_MS, TIMING_GAP_MS


def wait_for_point(bench: subprocess.Popen, marker: str = "bench triton-grpc ") -> str:
    """Read a running bench's stderr until its sweep point starts (imports alone can take seconds on a busy
    machine); return what was read, to be joined with the rest of stderr."""
    assert bench.stderr is not None
    seen: list[str] = []
    while not any(marker in line for line in seen) and bench.poll() is None:
        seen.append(bench.stderr.readline())
    return "".join(seen)


def start_bench(url: str, **options: Any) -> tuple[subprocess.Popen, str]:
    """A bench run in its own process (to be signalled or to lose its server), returned once its sweep point
    has started, with the stderr read so far (pass both to finish_bench)."""
    bench = subprocess.Popen(bench_argv(url, **options), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return bench, wait_for_point(bench)


def finish_bench(bench: subprocess.Popen, started: str, timeout: float = 60) -> tuple[str, str]:
    """(stdout, the whole stderr) of a run from start_bench, once it has ended."""
    stdout, stderr = bench.communicate(timeout=timeout)
    return stdout, started + stderr


def bench_json(*args: str, timeout: float = 300, in_process: bool = False) -> tuple[Any, Any]:
    """`trtllm-forge bench ARGS --json`: the finished process and its JSON document (None when stdout is not JSON).

    in_process=True runs it in this process (cli_inprocess: no interpreter start-up) for what measures nothing
    (`bench import`, `bench compare`, `--emit`, `--dry-run`, usage errors); a run that sends requests keeps its
    own process, as a user's does."""
    proc = run_in_process("bench", *args, "--json") if in_process else run_cli("bench", *args, "--json", timeout=timeout)
    try:
        return proc, json.loads(proc.stdout)
    except json.JSONDecodeError:
        return proc, None


def bench_run(url: str, *, timeout: float = 300, **options: Any) -> tuple[subprocess.CompletedProcess, Any]:
    """One bench run with the options of cli_argv.bench_options (plots off unless plots=True)."""
    return bench_json(*bench_options(url, **options), timeout=timeout)


def read_records(directory: Path) -> list[dict]:
    """The per-request records (requests.jsonl) a bench run or an import wrote into `directory`."""
    return [json.loads(line) for line in (directory / "requests.jsonl").read_text().splitlines()]
