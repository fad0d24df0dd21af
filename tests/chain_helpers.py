"""A whole `trtllm-forge run --keep-serving` of a shipped config, reusing the session's import, for the chain
tests of the CPU engines (OpenVINO LLM API stand-in, ONNX Runtime GenAI) and what every such run must show."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from conftest import run_cli
from trtllm_forge.hardware import HOST_PROFILE_ENV

CHAIN_STAGES = ["import", "build", "render", "deploy", "smoke", "verify", "bench"]


@contextmanager
def kept_run(
    root: Path, config: Path, imported_checkpoint: Path, env: dict[str, str] | None = None
) -> Iterator[tuple[Path, subprocess.CompletedProcess]]:
    """(workdir, the run's process); the server is stopped on exit. The config's model section must equal
    smollm2-cpu.yaml's so the session's import is reused (the stage's input hash matches)."""
    workdir = root / "wd"
    workdir.mkdir()
    shutil.copytree(imported_checkpoint.parent, workdir / "import", symlinks=True, copy_function=os.link)  # hard links: no 0.5 GB copy
    run_env = {HOST_PROFILE_ENV: str(root / "hardware-cpu.json"), **(env or {})}
    proc = run_cli("run", str(config), "--workdir", str(workdir), "--json", "--keep-serving", env=run_env, timeout=1500)
    try:
        yield workdir, proc
    finally:
        run_cli("deploy", "stop", "--workdir", str(workdir))


def run_document(proc: subprocess.CompletedProcess) -> dict:
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout)


def assert_chain_passed(doc: dict, concurrencies: list[int], requests_per_point: int) -> None:
    """Every stage ran (import reused), the smoke answer is right, verify is exact, every bench request completed."""
    assert [s["name"] for s in doc["stages"]] == CHAIN_STAGES
    assert all(s["status"] in ("done", "skipped") for s in doc["stages"])
    assert doc["stages"][0]["status"] == "skipped"  # the session's import was reused
    assert "Paris" in doc["answer"] and doc["stream_matches"] is True
    assert doc["verify"]["passed"] and doc["verify"]["agreement"]["prefix"] == 1.0
    points = doc["bench"]["workloads"][0]["points"]
    assert [p["load"]["value"] for p in points] == concurrencies
    assert all(p["requests"]["failed"] == 0 and p["requests"]["completed"] == requests_per_point for p in points)
