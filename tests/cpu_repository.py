"""The CPU repository rendered from configs/smollm2-cpu.yaml and the committed engine fixture: the clean starting
point the `render --check` tests seed faults into."""

from __future__ import annotations

from pathlib import Path

from conftest import CONFIGS, REPO

ENGINES = REPO / "tests" / "fixtures" / "engines"


def write_clean_cpu_repository(workdir: Path) -> Path:
    """Render it under `workdir`; returns the repository directory."""
    from trtllm_forge.config import load_config
    from trtllm_forge.engine_config import read_engine_config
    from trtllm_forge.render.repository import write_repository

    config = load_config(CONFIGS / "smollm2-cpu.yaml")
    return write_repository(config, workdir, read_engine_config(ENGINES / "smollm2-cpu"), "cpu", workdir / "model_repository").repository
