"""`trtllm-forge deploy CONFIG`, `deploy status`, `deploy stop`."""

from __future__ import annotations

import os
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
from trtllm_forge.deploy.kinds.protocol import NOT_RUNNING_EXIT, DeploymentStatus, Rendering, Speaks
from trtllm_forge.errors import ConfigError
from trtllm_forge.ui import emit_json, info


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
    """Serve the model with the config's deploy.server: Triton on the rendered model repository (default), or
    an OpenAI-compatible server on the llmapi build (see `config schema`, deploy.server).

    \b
    deploy CONFIG          start the server and wait until it is ready, e.g. tritonserver on
                           <workdir>/render/model_repository with every model ready (same as
                           `deploy start CONFIG`)
    deploy status [CONFIG] is it running, whatever its kind; processes, pid, URLs, model readiness;
                           exit 3 when not running, 1 when a process of it is dead
    deploy stop [CONFIG]   SIGTERM, then SIGKILL after a grace period; no process left (also the
                           python stubs a killed Triton left behind)

    deploy.target docker (or --target docker) runs a CPU config's Triton in a container of the CPU image
    (podman, else docker), its ports published on triton.bind_address; status and stop work on it the same way.

    One server per workdir. For Triton, start and stop hold <workdir>/deploy/state.lock, so a second
    `deploy` waits for the first to launch and then reports it as already running. The server's log is
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
    help="Where to serve; default deploy.target. docker runs a CPU config in a container of the CPU image "
    "(podman, else docker; built on first use) and writes the `docker run` script for GPU configs; kubernetes "
    "writes the manifest.",
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
    """Start the deploy.server kind where deploy.target (or --target) says and wait until it is ready: here, or in
    a container for a CPU config's docker target; or write the docker/kubernetes rendering the kind does not run.
    --dry-run prints the exact commands (the container runtime's too) and writes nothing."""
    from trtllm_forge.deploy.kinds import kind_of
    from trtllm_forge.deploy.launch import default_repository

    config, wd = load(config_file, workdir)
    if target is not None and target != config.deploy.target:
        config = config.model_copy(update={"deploy": config.deploy.model_copy(update={"target": target})})
    target = config.deploy.target
    if ready_timeout_s is not None and ready_timeout_s <= 0:
        raise ConfigError("--timeout", f"must be > 0, got {ready_timeout_s:g}", "give seconds, e.g. --timeout 120")
    kind = kind_of(config)
    repo = (repository or default_repository(wd)).resolve()
    if not kind.runs(config):
        _write_rendering(kind.render(config, wd, repo, target), target, dry_run, as_json)
        return
    if dry_run:
        plan = kind.plan_local(config, wd, repo)
        if as_json:
            emit_json(plan.document)
            return
        for heading, lines in plan.sections:
            info(heading)
            for line in lines:
                click.echo(line)
        return
    status = kind.status(kind.start(config, wd, repo, ready_timeout_s=ready_timeout_s))
    if as_json:
        emit_json(status.to_dict())
    else:
        _print_status(status)


def _write_rendering(rendering: Rendering, target: str, dry_run: bool, as_json: bool) -> None:
    path, text = rendering.path, rendering.text
    if not dry_run:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text)
        if rendering.executable:
            os.chmod(tmp, 0o755)
        os.replace(tmp, path)
    if as_json:
        emit_json({"target": target, "file": str(path), "written": not dry_run, "run": False, "note": rendering.note, "text": text})
        return
    info(f"{'would write' if dry_run else 'wrote'} {path} ({rendering.note})")
    click.echo(text, nl=False)


def _print_status(status: DeploymentStatus) -> None:
    deployment = status.deployment
    state = "[green]running[/green]" if status.running else "[red]not running[/red]"
    info(f"{state}  {status.server} ({deployment.speaks}), {deployment.where}")
    for process in status.processes if len(status.processes) > 1 or status.problems else []:
        alive = ("ready" if process.ready else "not ready") if process.alive else "[red]dead[/red]"
        pid = f" (pid {process.pid})" if process.pid else ""
        info(f"  process {process.role}{pid}: {alive}" + (f", log {process.log}" if process.log else ""))
    if deployment.speaks is Speaks.TRITON:
        info(f"  grpc    {deployment.grpc_url}")
    info(f"  http    {deployment.http_url}")
    if deployment.metrics_url:
        info(f"  metrics {deployment.metrics_url}")
    info(f"  log     {deployment.log}")
    for name, ready in sorted(status.endpoints.items()):
        info(f"  model {name}: {'ready' if ready else 'not ready'}")


@deploy_group.command("status")
@optional_config_argument
@workdir_option
@json_option
def status(config_file: Path | None, workdir: Path | None, as_json: bool) -> None:
    """Whether the deployment of this workdir is running (whatever its deploy.server), its processes, URLs and
    model readiness.

    Exit codes: 0 running and healthy; 1 running but unhealthy (a process of it is dead, or for Triton a python
    stub died: Triton still says ready while requests hang; its models show not ready, the problem is printed,
    "problems" in --json; restart with `deploy stop` and `deploy`, or for Dynamo's dead workers `deploy` alone); 3 not running (never deployed, stopped, or
    the server died; with --json the document is printed too); 2 bad arguments. Processes a dead server left
    behind are listed (`leftover_pids`); `deploy stop` or the next `deploy` stops them.
    """
    from trtllm_forge.deploy.kinds import deployed

    wd = _workdir_only(config_file, workdir, "status")
    found = deployed(wd)
    if found is None:
        if as_json:
            emit_json(
                {
                    "running": False,
                    "server": None,
                    "pid": None,
                    "grpc_url": None,
                    "http_url": None,
                    "metrics_url": None,
                    "models": {},
                    "processes": [],
                    "workdir": str(wd),
                    "leftover_pids": [],
                }
            )
        else:
            info(f"not running: no deployment recorded in {wd / 'deploy'}")
        sys.exit(NOT_RUNNING_EXIT)  # not click's Exit: cli.main (standalone_mode=False) would drop its code
    if as_json:
        emit_json(found.to_dict())
    else:
        _print_status(found)
        for problem in found.problems:
            what = "unhealthy" if found.running else "ended"
            info(f"[red]{what}[/red]: {problem}; restart with {found.restart}")
        if found.leftover_pids:
            info(
                f"  {len(found.leftover_pids)} process(es) the dead server left running: {found.leftover_pids}; "
                f"`trtllm-forge deploy stop --workdir {wd}` stops them"
            )
    if found.exit_code:
        sys.exit(found.exit_code)


@deploy_group.command("stop")
@optional_config_argument
@workdir_option
@click.option("--grace", type=float, default=20.0, show_default=True, help="Seconds between SIGTERM and SIGKILL.")
@json_option
def stop(config_file: Path | None, workdir: Path | None, grace: float, as_json: bool) -> None:
    """Stop the deployment of this workdir, whatever its deploy.server: every process it started (SIGTERM,
    SIGKILL after --grace seconds).

    For Triton also the python stubs a dead server left running: the processes of the process group recorded in
    <workdir>/deploy/state.json that carry the deployment's run mark (nothing else is signalled).
    """
    from trtllm_forge.deploy.kinds import KINDS

    wd = _workdir_only(config_file, workdir, "stop")
    stopped = {name: deployment for name, kind in KINDS.items() if (deployment := kind.stop(wd, grace_s=grace)) is not None}
    if not stopped:
        info(f"nothing to stop: no deployment recorded in {wd / 'deploy'}")
    for name, deployment in stopped.items():
        info(f"[green]✓[/green] deploy: {name} stopped ({deployment.where})")
    if as_json:
        documents = [{**deployment.to_dict(), "server": name} for name, deployment in stopped.items()]
        emit_json(documents[0] if len(documents) == 1 else {"running": False, "workdir": str(wd), "stopped": documents})
