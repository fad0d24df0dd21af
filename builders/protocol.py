"""The one shape every engine builder has: plan → commands → execute → a typed `BuildResult`.

A builder is a class with the five methods of `Builder` below (no base class needed: it is a Protocol). The
build stage, `build-engine` (with and without `--dry-run`) and `run --dry-run` only talk to builders through it,
found by `trtllm_forge.builders.registry.builder_for(config)`.

How to add a builder (e.g. `engine.backend: onnxruntime`):
1. a package `builders/<name>/` (installed as `trtllm_forge.builders.<name>`; add it to pyproject's `packages`)
   with a plan dataclass (what would run, decided from the config alone: no files written, no engine
   imported) and a class implementing `Builder`; `execute` runs its commands inside `stages.run_stage`
   (atomic temporary directory, manifest, input hash, logs) and returns `BuildResult.from_stage(...)`,
   whose manifest outputs carry at least `engine_dir` (or `llmapi_dir` for an LLM-API target);
2. its descriptor `builders/<name>/engine.py` (`builders/descriptor.py`), whose `builders` name the class per
   engine.target it serves:
       builders={"engine": "trtllm_forge.builders.onnxruntime.builder:OnnxRuntimeBuilder"},
3. the descriptor's line in `builders/engines.py` `ENGINES`: the schema's backend value, `registry.BUILDERS` and
   the rest follow from it (ARCHITECTURE.md, "How to add ... an engine").
Heavy imports (the engine's own library) belong inside `execute`, so `--help`, `plan` and `--dry-run` work
on machines without the engine.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol, TypeVar

from trtllm_forge.config.schema import ForgeConfig
from trtllm_forge.stage_results import BuildResult

PlanT = TypeVar("PlanT")


class Builder(Protocol[PlanT]):
    """An engine builder for one or more (engine.backend, engine.target) pairs of the registry."""

    def plan(self, config: ForgeConfig, workdir: Path, checkpoint_dir: Path) -> PlanT:
        """What the build would do, from the config and the checkpoint's metadata only; raises ConfigError
        for what the builder refuses. Writes nothing."""
        ...

    def commands(self, plan: PlanT) -> list[list[str]]:
        """The exact argv lists the build runs, in order (what `run --dry-run` lists)."""
        ...

    def describe(self, plan: PlanT) -> dict[str, Any]:
        """The plan as one JSON document (the `build` entry of `run --dry-run --json`)."""
        ...

    def show_dry_run(self, config: ForgeConfig, workdir: Path, plan: PlanT, as_json: bool) -> None:
        """`build-engine --dry-run`: print the plan (text on stderr, or one JSON document on stdout)."""
        ...

    def execute(self, config: ForgeConfig, workdir: Path, plan: PlanT, force: bool = False) -> BuildResult:
        """Run the plan as the `build` stage (skipped when its inputs are unchanged) and return the artifact."""
        ...
