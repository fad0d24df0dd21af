"""A whole `trtllm-forge run --keep-serving` of a shipped config, reusing the session's import and build, for the
chain tests of the CPU engines (OpenVINO LLM API stand-in, ONNX Runtime GenAI) and what every such run must show."""

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


def link_stages(workdir: Path, *stages: Path) -> None:
    """Put finished stage directories of the session (`<its workdir>/import`, `<its workdir>/build`) into
    `workdir` as if they had run there, so that `run` finds their inputs unchanged and skips them: hard links
    (no 0.5 GB copy) and their logs beside them, nothing rewritten. The paths their records hold point into the
    session's workdir; trtllm-forge reads them as under `workdir` (stage_results.moved_paths), as for a workdir a
    user copied."""
    (workdir / "logs").mkdir(parents=True, exist_ok=True)
    for stage in stages:
        shutil.copytree(stage, workdir / stage.name, symlinks=True, copy_function=os.link)
        for log in (stage.parent / "logs").glob(f"{stage.name}-*"):
            os.link(log, workdir / "logs" / log.name)


def reused_workdir(root: Path, *stages: Path) -> Path:
    """`root`/wd holding the session's finished `stages` (see link_stages)."""
    workdir = root / "wd"
    workdir.mkdir()
    link_stages(workdir, *stages)
    return workdir


def run_chain(
    workdir: Path, config: Path, *args: str, host_profile: Path, env: dict[str, str] | None = None, timeout: float = 1500
) -> subprocess.CompletedProcess:
    """`trtllm-forge run CONFIG --workdir WORKDIR --json ARGS` with the measured-host profile at `host_profile`
    (conftest.chain_host_profile: the session's first `run` with a bench measures this machine, the others read it)."""
    run_env = {HOST_PROFILE_ENV: str(host_profile), **(env or {})}
    return run_cli("run", str(config), "--workdir", str(workdir), "--json", *args, env=run_env, timeout=timeout)


@contextmanager
def kept_run(
    root: Path, config: Path, stages: list[Path], host_profile: Path, env: dict[str, str] | None = None
) -> Iterator[tuple[Path, subprocess.CompletedProcess]]:
    """(workdir, the run's process); the server is stopped on exit. `stages` are the session's finished stage
    directories the run reuses (see link_stages): the config must equal the one they were made with in what
    each stage hashes (its model section for the import, also its engine and quantization for a build)."""
    workdir = reused_workdir(root, *stages)
    proc = run_chain(workdir, config, "--keep-serving", host_profile=host_profile, env=env)
    try:
        yield workdir, proc
    finally:
        run_cli("deploy", "stop", "--workdir", str(workdir))


def run_document(proc: subprocess.CompletedProcess) -> dict:
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout)


def assert_chain_passed(doc: dict, concurrencies: list[int], requests_per_point: int, reused: tuple[str, ...] = ("import",)) -> None:
    """Every stage ran (the `reused` ones skipped: the session's), the smoke answer is right, verify is exact,
    every bench request completed."""
    assert [s["name"] for s in doc["stages"]] == CHAIN_STAGES
    status = {s["name"]: s["status"] for s in doc["stages"]}
    assert all(status[name] == ("skipped" if name in reused else "done") for name in CHAIN_STAGES if name != "bench"), status
    assert status["bench"] == "done"
    assert "Paris" in doc["answer"] and doc["stream_matches"] is True
    assert doc["verify"]["passed"] and doc["verify"]["agreement"]["prefix"] == 1.0
    points = doc["bench"]["workloads"][0]["points"]
    assert [p["load"]["value"] for p in points] == concurrencies
    assert all(p["requests"]["failed"] == 0 and p["requests"]["completed"] == requests_per_point for p in points)
