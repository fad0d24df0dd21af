"""What the bench tests (test_bench*.py, test_nvidia_clients.py) share: running `bench` through the CLI and
reading its JSON document. The options come from trtllm_forge.bench.cli_argv, which the fidelity script uses."""

from __future__ import annotations

import json
import subprocess
from typing import Any

from conftest import run_cli
from trtllm_forge.bench.cli_argv import bench_options


def wait_for_point(bench: subprocess.Popen, marker: str = "bench triton-grpc ") -> str:
    """Read a running bench's stderr until its sweep point starts (imports alone can take seconds on a busy
    machine); return what was read, to be joined with the rest of stderr."""
    assert bench.stderr is not None
    seen: list[str] = []
    while not any(marker in line for line in seen) and bench.poll() is None:
        seen.append(bench.stderr.readline())
    return "".join(seen)


def bench_json(*args: str, timeout: float = 300) -> tuple[subprocess.CompletedProcess, Any]:
    """`trtllm-forge bench ARGS --json`: the finished process and its JSON document (None when stdout is not JSON)."""
    proc = run_cli("bench", *args, "--json", timeout=timeout)
    try:
        return proc, json.loads(proc.stdout)
    except json.JSONDecodeError:
        return proc, None


def bench_run(url: str, *, timeout: float = 300, **options: Any) -> tuple[subprocess.CompletedProcess, Any]:
    """One bench run with the options of cli_argv.bench_options (plots off unless plots=True)."""
    return bench_json(*bench_options(url, **options), timeout=timeout)
