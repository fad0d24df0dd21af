"""Which builder builds a config: one table keyed by (engine.backend, engine.target).

Entries name the builder class as "module:Class" (declared in each engine's descriptor, `builders/<name>/engine.py`)
and are imported only when used, so a builder whose engine library is missing fails with one clear line, and only
for configs that need it. How to write a builder: see `trtllm_forge.builders.protocol`.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from trtllm_forge.builders.engines import ENGINES
from trtllm_forge.builders.protocol import Builder

from trtllm_forge.config.schema import ForgeConfig
from trtllm_forge.errors import ConfigError
from trtllm_forge.stage_results import BuildResult
from trtllm_forge.ui import emit_json, info

BuildKey = tuple[str, str]  # (engine.backend, engine.target)

# Each engine's builders, from its descriptor (builders/engines.py).
BUILDERS: dict[BuildKey, str] = {(engine.backend, target): reference for engine in ENGINES for target, reference in engine.builders.items()}


def builder_for(config: ForgeConfig) -> Builder[Any]:
    """The builder of config.engine.backend / config.engine.target (ConfigError, exit 2, when there is none)."""
    key = (config.engine.backend, config.engine.target)
    reference = BUILDERS.get(key)
    if reference is None:
        known = ", ".join(f"{backend}/{target}" for backend, target in sorted(BUILDERS))
        raise ConfigError("engine.backend", f"no builder for engine.backend {key[0]} with engine.target {key[1]}", f"one of {known}")
    module_name, _, class_name = reference.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(
            "engine.backend",
            f"the {key[0]} builder is not available in this installation ({exc})",
            "install its extra, or pick another backend",
        ) from None
    builder: Builder[Any] = getattr(module, class_name)()
    return builder


def build(config: ForgeConfig, workdir: Path, checkpoint_dir: Path, force: bool = False) -> BuildResult:
    """The build stage for any config: plan with its builder, then execute the plan."""
    builder = builder_for(config)
    return builder.execute(config, workdir, builder.plan(config, workdir, checkpoint_dir), force=force)


def dry_run_commands(config: ForgeConfig, workdir: Path, checkpoint_dir: Path) -> tuple[dict[str, Any], list[list[str]]]:
    """The plan document and the commands a build would run (`run --dry-run`)."""
    builder = builder_for(config)
    plan = builder.plan(config, workdir, checkpoint_dir)
    return builder.describe(plan), builder.commands(plan)


def report_build(result: BuildResult, as_json: bool) -> None:
    """What `build-engine` prints after a build: the manifest (--json) or where the artifact is."""
    if as_json:
        emit_json({**result.manifest, "skipped": result.skipped})
    elif result.engine_dir:
        info(f"engine: {result.engine_dir}")
    else:
        info(f"llmapi: {result.llmapi_dir}")
