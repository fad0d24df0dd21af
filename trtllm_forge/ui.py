"""Human-facing output. Everything for people goes to stderr so that stdout stays free for --json."""

from __future__ import annotations

import json
import sys
from typing import Any

from rich.console import Console

# Tables wrap at 80 columns when stderr is not a terminal (logs, CI); give them room there.
console = Console(stderr=True, highlight=False, soft_wrap=True, width=None if sys.stderr.isatty() else 160)


def info(message: str) -> None:
    console.print(message)


def warn(message: str) -> None:
    console.print(f"[yellow]warning:[/yellow] {message}")


def emit_json(data: Any) -> None:
    """The one JSON document a --json command prints on stdout."""
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
    sys.stdout.flush()
