"""`trtllm-forge config validate|show|schema`."""

from __future__ import annotations

import json
from pathlib import Path

import click
import yaml

from trtllm_forge.commands.options import config_argument, json_option
from trtllm_forge.config import ForgeConfig, load_config
from trtllm_forge.ui import emit_json, info, plain


@click.group("config")
def config_group() -> None:
    """Validate, show and describe configuration files."""


@config_group.command("validate")
@click.argument("config_files", metavar="CONFIG...", nargs=-1, required=True, type=click.Path(path_type=Path))
@json_option
def validate(config_files: tuple[Path, ...], as_json: bool) -> None:
    """Check one or more config files; exit 2 on the first invalid one."""
    results = []
    for path in config_files:
        config = load_config(path)
        results.append({"file": str(path), "name": config.name, "valid": True})
        info(f"[green]✓[/green] {plain(path)}: valid ({config.engine.backend}, {plain(config.model.source)})")
    if as_json:
        emit_json({"results": results})


@config_group.command("show")
@config_argument
@json_option
def show(config_file: Path, as_json: bool) -> None:
    """Print the fully resolved config, defaults included."""
    config = load_config(config_file)
    data = config.model_dump(mode="json")
    if as_json:
        emit_json(data)
    else:
        click.echo(yaml.safe_dump(data, sort_keys=False), nl=False)


@config_group.command("schema")
def schema() -> None:
    """Print the JSON Schema of the config file (every field with its description and default)."""
    data = ForgeConfig.model_json_schema()
    for internal in ("config_dir", "config_file"):
        data["properties"].pop(internal, None)
    click.echo(json.dumps(data, indent=2))
