"""Shared fixtures. Tests talk to real things (model, engine, server) wherever this machine allows."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
CONFIGS = REPO / "configs"


def run_cli(*args: str, cwd: Path | None = None, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run the real CLI in a subprocess (exit codes and stderr exactly as a user sees them)."""
    return subprocess.run(
        [sys.executable, "-m", "trtllm_forge", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, **(env or {})},
        timeout=timeout,
    )


@pytest.fixture
def cli():
    return run_cli


@pytest.fixture
def write_config(tmp_path):
    """Write a YAML config (text) into tmp_path and return its path."""

    def _write(text: str, name: str = "test.yaml") -> Path:
        path = tmp_path / name
        path.write_text(text)
        return path

    return _write
