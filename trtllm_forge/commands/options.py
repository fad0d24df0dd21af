"""Options shared by the commands, so every command spells them the same way."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from trtllm_forge.config import ForgeConfig, load_config

FILE = click.Path(dir_okay=False, path_type=Path)
DIRECTORY = click.Path(file_okay=False, path_type=Path)
F = TypeVar("F", bound=Callable[..., Any])  # a command function, returned as it came with its option added


def config_argument(func: F) -> F:
    return click.argument("config_file", metavar="CONFIG", type=FILE)(func)


def optional_config_argument(func: F) -> F:
    """CONFIG for commands that also work without one (they read the workdir, or take another input instead)."""
    return click.argument("config_file", metavar="[CONFIG]", required=False, type=FILE)(func)


def directory_option(*param_decls: str, help: str, required: bool = False) -> Callable[[F], F]:
    """A directory path option (not checked to exist); unset is None."""
    return click.option(*param_decls, type=DIRECTORY, default=None, required=required, help=help)


def workdir_option(func: F) -> F:
    return directory_option("--workdir", help="Where artifacts, logs and manifests go. Default: ./forge-work/<config name>.")(func)


def json_option(func: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout.")(func)


def dry_run_option(func: F) -> F:
    return click.option("--dry-run", is_flag=True, help="Print the commands and files this would produce; change nothing.")(func)


def force_option(func: F) -> F:
    return click.option("--force", is_flag=True, help="Redo the stage even when its inputs are unchanged.")(func)


def resolve_workdir(config: ForgeConfig, workdir: Path | None) -> Path:
    return (workdir or Path("forge-work") / (config.name or "default")).resolve()


def load(config_file: Path, workdir: Path | None) -> tuple[ForgeConfig, Path]:
    config = load_config(config_file)
    return config, resolve_workdir(config, workdir)
