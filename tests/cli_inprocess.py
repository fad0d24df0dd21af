"""Run the trtllm-forge CLI in this process (fast: no interpreter start-up), with the exit code, stdout
and stderr a user would see: `main()` maps errors to exit codes; Click's CliRunner isolates the streams."""

from __future__ import annotations

from dataclasses import dataclass

from click.testing import CliRunner

from trtllm_forge.cli import main


@dataclass
class Outcome:
    returncode: int
    stdout: str
    stderr: str
    exception: BaseException | None = None  # anything main() let through (a bug: main() must map every error)


def run_in_process(*args: str) -> Outcome:
    runner = CliRunner()
    with runner.isolation() as streams:
        code, escaped = 0, None
        try:
            main(list(args))
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException as exc:  # noqa: BLE001 - reported to the test, which fails on it
            code, escaped = -1, exc
        stdout, stderr = streams[0].getvalue(), streams[1].getvalue()
    return Outcome(code, stdout.decode(errors="replace"), stderr.decode(errors="replace"), escaped)
