"""`trtllm-forge version`: this tool's version and the versions of the engines it can drive."""

from __future__ import annotations

from typing import Any

import click

from trtllm_forge import __version__
from trtllm_forge.commands.options import json_option
from trtllm_forge.components import installed_versions
from trtllm_forge.ui import emit_json


@click.command()
@json_option
def version(as_json: bool) -> None:
    """Print the versions of trtllm-forge and of the engines and clients it uses."""
    data: dict[str, Any] = {"trtllm-forge": __version__, "components": installed_versions()}
    if as_json:
        emit_json(data)
        return
    click.echo(f"trtllm-forge {__version__}")
    for name, ver in data["components"].items():
        click.echo(f"  {name:17} {ver or 'not installed'}")
