"""`trtllm-forge render CONFIG --engine-dir DIR` and `trtllm-forge render --check DIR`."""

from __future__ import annotations

from pathlib import Path

import click

from trtllm_forge.commands.options import (
    directory_option,
    dry_run_option,
    force_option,
    json_option,
    load,
    optional_config_argument,
    workdir_option,
)
from trtllm_forge.errors import ConfigError
from trtllm_forge.ui import emit_json, info, plain, warn

KIND_CHOICES = ("inflight_batcher_llm", "cpu", "llmapi", "vllm")


@click.command("render")
@optional_config_argument
@directory_option("--engine-dir", help="Engine directory (its config.json). Default: <workdir>/build/engine.")
@click.option(
    "--kind",
    type=click.Choice(KIND_CHOICES),
    default=None,
    help="Repository kind. Default: cpu for openvino, inflight_batcher_llm for TensorRT-LLM engines, llmapi for engine.target llmapi.",
)
@directory_option("--out", help="Write the repository here instead of <workdir>/render/model_repository (no manifest, no launch script).")
@directory_option("--check", "check_dir", help="Only validate the repository in this directory (any repository, also hand-written ones).")
@workdir_option
@dry_run_option
@json_option
@force_option
def render(
    config_file: Path | None,
    engine_dir: Path | None,
    kind: str | None,
    out: Path | None,
    check_dir: Path | None,
    workdir: Path | None,
    dry_run: bool,
    as_json: bool,
    force: bool,
) -> None:
    """Render a complete, validated Triton model repository from CONFIG and the engine's config.json.

    \b
    `render --check DIR` validates an existing repository: every config.pbtxt parses, names match
    directories, version directories exist, nothing is left as ${...}, data types are Triton's and dims are -1
    or >= 1, ensemble maps agree on tensor names, data types and dims, and decoupled settings are consistent.
    Exit 2 on any problem, each one line naming the file and line.
    """
    if check_dir is not None:
        if config_file is not None:
            raise ConfigError("--check", "takes a repository directory and no CONFIG", "run `render --check DIR` alone")
        _check(check_dir, as_json)
        return
    if config_file is None:
        raise ConfigError("CONFIG", "missing", "pass a config file, or --check DIR to validate a repository")
    from trtllm_forge.render import repository as repo

    config, wd = load(config_file, workdir)
    if dry_run:
        plan = repo.dry_run(config, wd, engine_dir, kind, out)
        if as_json:
            emit_json({"dry_run": True, **plan})
        else:
            info(f"would render a {plan['kind']} repository into {plan['repository']}:")
            for path in plan["files"]:
                info(f"  {path}")
            for argv in plan["commands"]:
                info(f"would run: [dim]{' '.join(argv)}[/dim]")
            info("launch command:")
            info(f"  [dim]{' '.join(plan['launch_command'])}[/dim]")
        for message in plan["warnings"]:
            warn(message)
        return
    if out is not None:
        rendered = repo.render_to_directory(config, wd, engine_dir, kind, out)
        for message in rendered.warnings:
            warn(message)
        info(f"[green]✓[/green] render: {rendered.kind} repository ({', '.join(rendered.models)}) → {rendered.repository}")
        if as_json:
            emit_json(
                {
                    "kind": rendered.kind,
                    "repository": str(rendered.repository),
                    "models": rendered.models,
                    "warnings": rendered.warnings,
                    "problems": [p.to_dict() for p in rendered.problems],
                }
            )
        return
    result = repo.render_repository(config, wd, engine_dir, kind=kind, force=force)
    for message in result.warnings:
        warn(message)
    if as_json:
        emit_json({"stage": "render", "skipped": result.skipped, "directory": str(result.directory), **result.manifest.get("outputs", {})})
    else:
        info(f"  repository: {result.repository}")
        info(f"  launch: {result.launch_script}")


def _check(directory: Path, as_json: bool) -> None:
    from trtllm_forge.render.validate import check_repository, raise_on_errors

    problems = check_repository(directory.absolute())
    errors = [p for p in problems if p.level == "error"]
    for problem in problems:
        if problem.level == "warning":
            warn(plain(f"{problem.file}:{problem.line}: {problem.message}; {problem.hint}"))
    if as_json:
        emit_json({"repository": str(directory.absolute()), "valid": not errors, "problems": [p.to_dict() for p in problems]})
    if not errors:
        info(f"[green]✓[/green] {plain(directory)}: valid Triton model repository")
    raise_on_errors(problems)
