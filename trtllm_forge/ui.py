"""Human-facing output. Everything for people goes to stderr so that stdout stays free for --json.

Messages mix our rich markup (`[green]✓[/green]`) with text the user controls: paths, names, config
values, server and exception messages. Rich would interpret a `[/x]` in a path as a closing tag (and
crash) or a `[link=...]` as a hyperlink. So the console keeps only balanced pairs of plain style tags,
and shows every other bracket as written; text that must never be styled goes through `plain()`.
"""

from __future__ import annotations

import json
import re
import sys
from functools import lru_cache
from typing import Any

from rich.console import Console
from rich.errors import StyleSyntaxError
from rich.markup import escape
from rich.style import Style
from rich.text import Text

# rich.markup's tag pattern: a run of backslashes (an odd count escapes the tag), then [tag].
_TAG = re.compile(r"(\\*)\[([a-z#/@][^[]*?)]")


@lru_cache(maxsize=256)
def _is_style(text: str) -> bool:
    if not text or any(c in text for c in "=@[]") or "link" in text.split():
        return False
    try:
        Style.parse(text)
    except StyleSyntaxError:
        return False
    return True


def protect(markup: str) -> str:
    """`markup` with every tag escaped except balanced pairs of style tags ([bold red]...[/bold red] or [/])."""
    tags = [m for m in _TAG.finditer(markup) if len(m.group(1)) % 2 == 0]
    keep: set[int] = set()
    stack: list[tuple[int, str]] = []
    for index, match in enumerate(tags):
        body = match.group(2)
        if body.startswith("/"):
            name = body[1:].strip()
            if stack and (not name or stack[-1][1] == name):
                keep.update((stack.pop()[0], index))
        elif _is_style(body.strip()):
            stack.append((index, body.strip()))
    if len(keep) == len(tags):
        return markup
    out, last = [], 0
    for index, match in enumerate(tags):
        if index in keep:
            continue
        bracket = match.start(2) - 1
        out.append(markup[last:bracket] + "\\")
        last = bracket
    out.append(markup[last:])
    return "".join(out)


def plain(text: object) -> str:
    """User text as it is, for a message that also holds markup: never styled, never a tag."""
    return escape(str(text))


class _Console(Console):
    def render_str(self, text: str, *args: Any, markup: bool | None = None, **kwargs: Any) -> Text:
        if markup is not False and self._markup:
            text = protect(text)
        return super().render_str(text, *args, markup=markup, **kwargs)


# Tables wrap at 80 columns when stderr is not a terminal (logs, CI); give them room there.
# emoji=False: a ':smile:' in a path stays as written.
console = _Console(stderr=True, highlight=False, soft_wrap=True, emoji=False, width=None if sys.stderr.isatty() else 160)


def info(message: str) -> None:
    console.print(message)


def warn(message: str) -> None:
    console.print(f"[yellow]warning:[/yellow] {message}")


def emit_json(data: Any) -> None:
    """The one JSON document a --json command prints on stdout."""
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
    sys.stdout.flush()
