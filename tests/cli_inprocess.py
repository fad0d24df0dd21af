"""Run the trtllm-forge CLI in this process (fast: no interpreter start-up), with the exit code, stdout
and stderr a user would see: `main()` maps errors to exit codes; Click's CliRunner isolates the streams.

Use it for every CLI test that needs no real process boundary. Keep `conftest.run_cli` (a real subprocess)
for what only a process shows: the entry point itself, signals, commands that start a server that must
outlive the call (`deploy CONFIG`, `run --keep-serving`), a child's environment (PYTHONPATH, sitecustomize).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from trtllm_forge.cli import main
from trtllm_forge.hardware import hardware_table


@dataclass
class Outcome:
    """What a subprocess.CompletedProcess offers the tests: returncode, stdout, stderr."""

    returncode: int
    stdout: str
    stderr: str
    exception: BaseException | None = None  # anything main() let through (a bug: main() must map every error)


def run_in_process(*args: str, env: dict[str, str] | None = None, cwd: Path | str | None = None) -> Outcome:
    """`trtllm-forge ARGS` in this process. `env` is added to os.environ and `cwd` entered for the call only
    (both restored afterwards), as a subprocess would get them."""
    runner = CliRunner()
    previous_cwd = os.getcwd()
    with runner.isolation(env=env) as streams:
        code, escaped = 0, None
        # A fresh process reads the measured-host profile anew (its path can come from `env`).
        hardware_table.cache_clear()
        try:
            if cwd is not None:
                os.chdir(cwd)
            main(list(args))
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException as exc:
            code, escaped = -1, exc
        finally:
            os.chdir(previous_cwd)
            hardware_table.cache_clear()
        stdout, stderr = streams[0].getvalue(), streams[1].getvalue()
    if escaped is not None and not isinstance(escaped, Exception):
        raise escaped  # KeyboardInterrupt and the like belong to pytest
    return Outcome(code, stdout.decode(errors="replace"), stderr.decode(errors="replace"), escaped)


def json_in_process(*args: str, env: dict[str, str] | None = None, cwd: Path | str | None = None) -> Any:
    """`trtllm-forge ARGS --json` in this process, checked to exit 0: its JSON document."""
    outcome = run_in_process(*args, "--json", env=env, cwd=cwd)
    assert outcome.returncode == 0 and outcome.exception is None, outcome.stderr
    return json.loads(outcome.stdout)
