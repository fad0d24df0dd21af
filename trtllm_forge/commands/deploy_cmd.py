"""`trtllm-forge deploy CONFIG`, `deploy status`, `deploy stop`."""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

import click

from trtllm_forge.commands.options import (
    config_argument,
    directory_option,
    dry_run_option,
    json_option,
    load,
    optional_config_argument,
    workdir_option,
)
from trtllm_forge.errors import ConfigError
from trtllm_forge.ui import emit_json, info

NOT_RUNNING_EXIT = 3  # `deploy status` when no server runs, so scripts can tell it from an error (1, 2)


class DefaultCommandGroup(click.Group):
    """A group whose first argument, when it is not a subcommand, goes to a default subcommand.

    `deploy CONFIG` means `deploy start CONFIG`, while `deploy status` and `deploy stop` stay subcommands.
    """

    default_command = "start"

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ctx.help_option_names:
            args = [self.default_command, *args]
        return super().parse_args(ctx, args)

    def format_usage(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        formatter.write_usage(ctx.command_path, "[start] CONFIG [OPTIONS] | status [CONFIG] | stop [CONFIG]")


def _workdir_only(config_file: Path | None, workdir: Path | None, command: str) -> Path:
    """The workdir for status/stop: --workdir, else the one CONFIG implies."""
    if workdir is not None:
        return workdir.resolve()
    if config_file is None:
        raise ConfigError(
            f"deploy {command}",
            "needs CONFIG or --workdir to find the deployment",
            f"e.g. `trtllm-forge deploy {command} configs/smollm2-cpu.yaml`",
        )
    return load(config_file, None)[1]


@click.group("deploy", cls=DefaultCommandGroup, no_args_is_help=True)
def deploy_group() -> None:
    """Serve the rendered model repository with a real Triton server.

    \b
    deploy CONFIG          start tritonserver on <workdir>/render/model_repository and wait for
                           every model to be ready (same as `deploy start CONFIG`)
    deploy status [CONFIG] is it running; pid, URLs, model readiness; exit 3 when not running
    deploy stop [CONFIG]   SIGTERM, then SIGKILL after a grace period; no process left (also the
                           python stubs a killed server left behind)

    One server per workdir: start and stop hold <workdir>/deploy/state.lock, so a second `deploy`
    waits for the first to launch and then reports it as already running. The server's log is
    <workdir>/logs/tritonserver.log; earlier ones are kept as tritonserver.1.log, .2.log, ...
    """


@deploy_group.command("start")
@config_argument
@workdir_option
@directory_option("--repository", help="Model repository to serve. Default: <workdir>/render/model_repository.")
@click.option(
    "--target",
    type=click.Choice(["local", "docker", "kubernetes"]),
    default=None,
    help="Where to serve; default deploy.target. docker/kubernetes only render the command/manifest.",
)
@click.option(
    "--timeout", "ready_timeout_s", type=float, default=None, help="Seconds to wait for readiness; default deploy.ready_timeout_s."
)
@dry_run_option
@json_option
def start(
    config_file: Path,
    workdir: Path | None,
    repository: Path | None,
    target: str | None,
    ready_timeout_s: float | None,
    dry_run: bool,
    as_json: bool,
) -> None:
    """Start Triton on the model repository and wait until every model is ready."""
    config, wd = load(config_file, workdir)
    target = target or config.deploy.target
    if ready_timeout_s is not None and ready_timeout_s <= 0:
        raise ConfigError("--timeout", f"must be > 0, got {ready_timeout_s:g}", "give seconds, e.g. --timeout 120")
    from trtllm_forge.deploy.launch import default_repository

    repo = (repository or default_repository(wd)).resolve()
    if config.deploy.server == "trtllm-serve":  # the deploy kind lives in deploy/trtllm_serve.py
        from trtllm_forge.deploy import trtllm_serve

        described = trtllm_serve.deploy(config, wd, target, dry_run)
        emit_json(described) if as_json else info(f"trtllm-serve: {described.get('url') or described.get('file')}")
        return
    if target != "local":
        _render_target(config, wd, repo, target, dry_run, as_json)
        return
    if dry_run:
        from trtllm_forge.deploy.launch import plan_launch

        plan = plan_launch(config, wd, repo)
        described = {**plan.describe(), "dry_run": True, "state": str(wd / "deploy" / "state.json")}
        if as_json:
            emit_json(described)
            return
        info("would run (ports 0 are picked again at a real start):")
        click.echo(shlex.join(plan.argv))
        info("environment added:")
        for key, value in plan.env.items():
            click.echo(f"{key}={value}")
        info("files:")
        for dest, source in plan.backend_files.items():
            click.echo(f"{dest} <- {source}")
        click.echo(f"{plan.log} (server log)")
        click.echo(f"{wd / 'deploy' / 'state.json'} (deployment state)")
        info(f"models to wait for: {', '.join(plan.models)}")
        return
    from trtllm_forge.deploy.server import start_server

    deployment = start_server(config, wd, repo, ready_timeout_s=ready_timeout_s)
    if as_json:
        emit_json(deployment.to_dict())
    else:
        _print_deployment(deployment)


def _render_target(config, wd: Path, repo: Path, target: str, dry_run: bool, as_json: bool) -> None:
    from trtllm_forge.deploy.targets import render_target

    path, text = render_target(config, wd, repo, target)
    if not dry_run:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text)
        if target == "docker":
            os.chmod(tmp, 0o755)
        os.replace(tmp, path)
    if as_json:
        emit_json({"target": target, "file": str(path), "written": not dry_run, "text": text})
        return
    info(f"{'would write' if dry_run else 'wrote'} {path} (rendered only: no Docker engine or cluster is contacted)")
    click.echo(text, nl=False)


def _print_deployment(deployment) -> None:
    state = "[green]running[/green]" if deployment.running else "[red]not running[/red]"
    info(f"{state}  pid {deployment.pid}")
    info(f"  grpc    {deployment.grpc_url}")
    info(f"  http    {deployment.http_url}")
    info(f"  metrics {deployment.metrics_url}")
    info(f"  log     {deployment.log}")
    for name, ready in sorted(deployment.models.items()):
        info(f"  model {name}: {'ready' if ready else 'not ready'}")


@deploy_group.command("status")
@optional_config_argument
@workdir_option
@json_option
def status(config_file: Path | None, workdir: Path | None, as_json: bool) -> None:
    """Whether the deployment of this workdir is running, its URLs and model readiness.

    Exit codes: 0 running and healthy; 1 running but unhealthy (a python stub died: Triton still says ready
    while requests hang; its models show not ready, the problem is printed, "problems" in --json; restart with
    `deploy stop` and `deploy`); 3 not running (never deployed, stopped, or the server died; with --json the
    document is printed too); 2 bad arguments. Processes a dead server left behind are listed
    (`leftover_pids`); `deploy stop` or the next `deploy` stops them.
    """
    from trtllm_forge.deploy.health import stub_health
    from trtllm_forge.deploy.server import leftover_processes, server_status

    wd = _workdir_only(config_file, workdir, "status")
    deployment = server_status(wd)
    if deployment is None:
        if as_json:
            emit_json(
                {
                    "running": False,
                    "pid": None,
                    "grpc_url": None,
                    "http_url": None,
                    "metrics_url": None,
                    "models": {},
                    "workdir": str(wd),
                    "leftover_pids": [],
                }
            )
        else:
            info(f"not running: no deployment recorded in {wd / 'deploy' / 'state.json'}")
        sys.exit(NOT_RUNNING_EXIT)  # not click's Exit: cli.main (standalone_mode=False) would drop its code
    problems = stub_health(deployment.pgid or deployment.pid, Path(deployment.repository)).problems() if deployment.running else []
    leftovers = [] if deployment.running else leftover_processes(deployment)
    if as_json:
        emit_json({**deployment.to_dict(), "problems": problems, "leftover_pids": leftovers})
    else:
        _print_deployment(deployment)
        for problem in problems:
            info(f"[red]unhealthy[/red]: {problem}; restart with `trtllm-forge deploy stop` and `trtllm-forge deploy`")
        if leftovers:
            info(
                f"  {len(leftovers)} process(es) the dead server left running: {leftovers}; "
                f"`trtllm-forge deploy stop --workdir {wd}` stops them"
            )
    if not deployment.running:
        sys.exit(NOT_RUNNING_EXIT)
    if problems:
        sys.exit(1)


@deploy_group.command("stop")
@optional_config_argument
@workdir_option
@click.option("--grace", type=float, default=20.0, show_default=True, help="Seconds between SIGTERM and SIGKILL.")
@json_option
def stop(config_file: Path | None, workdir: Path | None, grace: float, as_json: bool) -> None:
    """Stop the server of this workdir and its python stubs (SIGTERM, SIGKILL after --grace seconds).

    Also stops the stubs a dead server left running: the processes of the process group recorded in
    <workdir>/deploy/state.json that carry the deployment's run mark (nothing else is signalled).
    """
    from trtllm_forge.deploy.server import stop_server

    wd = _workdir_only(config_file, workdir, "stop")
    from trtllm_forge.deploy import trtllm_serve

    if trtllm_serve.stop(wd) is not None:
        info(f"trtllm-serve stopped ({wd / 'deploy' / trtllm_serve.STATE})")
    deployment = stop_server(wd, grace_s=grace)
    if deployment is None:
        info(f"nothing to stop: no deployment recorded in {wd / 'deploy' / 'state.json'}")
    if as_json:
        emit_json(deployment.to_dict() if deployment else {"running": False, "workdir": str(wd)})
