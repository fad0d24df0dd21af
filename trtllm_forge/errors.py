"""The two kinds of failure the CLI reports, and how they map to exit codes.

Exit codes: 0 success; 2 usage or configuration error; 1 a step failed at run time.
Messages are one line: `[<file>[:<line>]: ]<where>: <what is wrong>; <what would be valid>`.
"""

from __future__ import annotations

from typing import IO, TYPE_CHECKING

import click

if TYPE_CHECKING:
    from typing import Self  # typing.Self from Python 3.11


# Control characters (and the separators str.splitlines() breaks on) shown escaped: an error is one line.
_ESCAPES = {c: f"\\x{c:02x}" for c in (*range(0x20), 0x7F, 0x85)} | {0x2028: "\\u2028", 0x2029: "\\u2029"}


def _one_line(text: str) -> str:
    return str(text).translate(_ESCAPES)


def _capped(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return f"{text[: limit * 2 // 3]} …[{len(text) - limit:,} characters left out]… {text[-limit // 4 :]}"


class ForgeError(click.ClickException):
    """Base of every error the CLI reports as one line without a traceback."""

    exit_code = 1

    def __init__(self, where: str, problem: str, valid: str | None = None, *, source: str | None = None):
        # Never echo a megabyte of hostile input, nor a newline that would split the error line.
        where, problem = _capped(_one_line(where), 160), _capped(_one_line(problem), 400)
        valid = _one_line(valid) if valid else valid
        source = _one_line(source) if source else source  # a file name may hold a newline too
        self.where = where  # the field, flag or step
        self.problem = problem
        self.valid = valid
        self.source = source  # the file (and line) the field was read from, when there is one
        message = f"{where}: {problem}" if where else problem
        if valid:
            message += f"; {valid}"
        if source:
            message = f"{source}: {message}"
        super().__init__(message)

    def located(self, source: str) -> Self:
        """The same error, naming the file (and line) its field was read from."""
        return type(self)(self.where, self.problem, self.valid, source=source)

    def show(self, file: IO[str] | None = None) -> None:
        click.echo(f"error: {self.format_message()}", err=True, file=file)


class ConfigError(ForgeError):
    """Bad input: invalid YAML, value, flag or combination (exit 2)."""

    exit_code = 2


class StepError(ForgeError):
    """A step failed at run time: subprocess, server, timeout (exit 1)."""

    exit_code = 1


def error_document(exc: BaseException) -> dict:
    """The JSON form of a failure, for commands whose --json promises one document on stdout."""
    if isinstance(exc, ForgeError):
        kind = "config" if isinstance(exc, ConfigError) else "step"
        errors = getattr(exc, "errors", [exc])
        return {
            "kind": kind,
            "exit_code": exc.exit_code,
            "message": exc.format_message(),
            "errors": [
                {"source": e.source, "where": e.where, "problem": e.problem, "valid": e.valid, "message": e.format_message()}
                for e in errors
            ],
        }
    if isinstance(exc, KeyboardInterrupt):
        return {"kind": "interrupted", "exit_code": 130, "message": "interrupted", "errors": []}
    if isinstance(exc, click.ClickException):
        return {"kind": "usage", "exit_code": exc.exit_code, "message": exc.format_message(), "errors": []}
    first_line = (str(exc).strip().splitlines() or [""])[0]
    return {"kind": "internal", "exit_code": 1, "message": f"internal: {type(exc).__name__}: {first_line}", "errors": []}


class ConfigErrors(ConfigError):
    """Several configuration problems found at once; shown one per line."""

    def __init__(self, errors: list[ConfigError]):
        self.errors = errors
        first = errors[0]
        super().__init__(first.where, first.problem, first.valid, source=first.source)

    def show(self, file: IO[str] | None = None) -> None:
        for err in self.errors:
            err.show(file=file)
