"""The trtllm-forge command line.

Heavy dependencies (torch, transformers, OpenVINO, tensorrt_llm, tritonclient) are imported only inside
the commands that use them, so `--help` and `config ...` work without them.
"""

from __future__ import annotations

import errno
import importlib
import sys
import traceback
from typing import NoReturn

import click

from trtllm_forge import __version__
from trtllm_forge.errors import ConfigError, ForgeError, StepError

# (module, attribute) of every command; each module registers one command or group.
COMMANDS: list[tuple[str, str]] = [
    ("trtllm_forge.commands.config_cmd", "config_group"),
    ("trtllm_forge.commands.plan_cmd", "plan"),
    ("trtllm_forge.commands.import_cmd", "import_model"),
    ("trtllm_forge.commands.build_cmd", "build_engine"),
    ("trtllm_forge.commands.render_cmd", "render"),
    ("trtllm_forge.commands.deploy_cmd", "deploy_group"),
    ("trtllm_forge.commands.verify_cmd", "verify"),
    ("trtllm_forge.commands.bench_cmd", "bench_group"),
    ("trtllm_forge.commands.run_cmd", "run"),
    ("trtllm_forge.commands.tune_cmd", "tune"),
    ("trtllm_forge.commands.version_cmd", "version"),
    ("trtllm_forge.commands.doctor_cmd", "doctor"),
]


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("--debug", is_flag=True, help="Show tracebacks for errors.")
@click.version_option(__version__, prog_name="trtllm-forge")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """From an LLM checkpoint and one YAML file to a served, measured endpoint.

    \b
    Exit codes: 0 success; 2 usage or configuration error; 1 a step failed at run time.
    """
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug


for module_name, attribute in COMMANDS:
    cli.add_command(getattr(importlib.import_module(module_name), attribute))


_NO_ARGS_IS_HELP = getattr(click.exceptions, "NoArgsIsHelpError", None)  # click >= 8.2


def _one_line_unraisable(unraisable: sys.UnraisableHookArgs) -> None:
    """An exception Python cannot raise (a destructor's, e.g. of a client half-built when SIGTERM interrupted it)
    in one line instead of a traceback; --debug keeps Python's default."""
    exc = unraisable.exc_value
    first_line = (str(exc).strip().splitlines() or [""])[0]
    where = f" in {unraisable.object!r}" if unraisable.object is not None else ""
    click.echo(f"warning: ignored{where}: {type(exc).__name__}: {first_line}", err=True)


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    debug = "--debug" in args
    if not debug and sys.unraisablehook is sys.__unraisablehook__:  # not when a host (pytest) installed its own
        sys.unraisablehook = _one_line_unraisable
    try:
        cli.main(args=args, prog_name="trtllm-forge", standalone_mode=False)
    except ForgeError as exc:
        if debug:
            traceback.print_exc()
        exc.show()
        sys.exit(exc.exit_code)
    except click.UsageError as exc:
        if _NO_ARGS_IS_HELP and isinstance(exc, _NO_ARGS_IS_HELP) and exc.ctx:
            click.echo(exc.ctx.get_help(), err=True)
            sys.exit(2)
        hint = f"see `{exc.ctx.command_path} --help`" if exc.ctx else "see `trtllm-forge --help`"
        ConfigError("usage", exc.format_message(), hint).show()
        sys.exit(2)
    except click.ClickException as exc:
        click.echo(f"error: {exc.format_message()}", err=True)
        sys.exit(exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.Abort:
        click.echo("error: aborted", err=True)
        sys.exit(130)
    except KeyboardInterrupt:
        click.echo("error: interrupted; partial outputs were discarded, logs kept", err=True)
        sys.exit(130)
    except OSError as exc:
        if debug:
            traceback.print_exc()
        if exc.errno not in _STORAGE_ERRNOS:
            _internal(exc)
        # Every stage builds into a temporary folder and renames it into place, so nothing half-written is left.
        where = f"could not write {exc.filename}" if exc.filename else "could not write"
        StepError("(disk)", f"{where}: {exc.strerror}", "free space there (or choose another --workdir / --out) and rerun").show()
        sys.exit(1)
    except Exception as exc:
        if debug:
            traceback.print_exc()
        _internal(exc)
    sys.exit(0)


# A full disk, a quota, a read-only filesystem: the user's storage, not a bug of ours.
_STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG})


def _internal(exc: BaseException) -> NoReturn:
    first_line = (str(exc).strip().splitlines() or [""])[0]
    click.echo(f"error: internal: {type(exc).__name__}: {first_line}; rerun with --debug for a traceback", err=True)
    sys.exit(1)
