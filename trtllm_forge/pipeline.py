"""The whole chain behind `trtllm-forge run`: import → build → render → deploy → smoke → verify → bench → report.

Each stage is the same code its own command runs; cached stages are skipped when their inputs are unchanged.
The server is always stopped at the end (errors and Ctrl-C included) unless the caller keeps it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from rich.table import Table

from trtllm_forge.config.schema import ForgeConfig
from trtllm_forge.entrypoint import entry_model, is_llmapi
from trtllm_forge.errors import ConfigError, StepError
from trtllm_forge.stage_results import BuildResult
from trtllm_forge.stages import StageResult, terminate_as_error
from trtllm_forge.ui import console, info, plain

if TYPE_CHECKING:
    from trtllm_forge.deploy.kinds import Deployment
    from trtllm_forge.verify.check import VerifyReport

SMOKE_PROMPT = "The capital of France is"
T = TypeVar("T")


@dataclass
class StageOutcome:
    name: str
    status: str  # done | skipped | failed | not run
    seconds: float = 0.0
    detail: str = ""


@dataclass
class RunReport:
    config_name: str
    workdir: Path
    stages: list[StageOutcome] = field(default_factory=list)
    answer: str | None = None
    stream_matches: bool | None = None
    verify: VerifyReport | None = None
    bench: dict | None = None
    deployment: Deployment | None = None
    kept_serving: bool = False
    paths: dict[str, str] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return all(s.status in ("done", "skipped") for s in self.stages) and (self.verify is None or self.verify.passed)

    def to_json(self) -> dict:
        return {
            "config": self.config_name,
            "workdir": str(self.workdir),
            "passed": self.passed,
            "stages": [vars(s) for s in self.stages],
            "answer": self.answer,
            "stream_matches": self.stream_matches,
            "verify": self.verify.to_json() if self.verify else None,
            "bench": self.bench,
            "serving": self.deployment.to_dict() if (self.deployment and self.kept_serving) else None,
            "paths": self.paths,
        }


class _Stages:
    """Times each stage and records its outcome, also when it raises."""

    def __init__(self, report: RunReport):
        self.report = report

    def run(self, name: str, func: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        started = time.monotonic()
        outcome = StageOutcome(name, "failed")
        self.report.stages.append(outcome)
        try:
            result = func(*args, **kwargs)
        except Exception as exc:
            outcome.detail = _first_line(exc)
            raise
        finally:
            outcome.seconds = round(time.monotonic() - started, 2)
        outcome.status = "skipped" if isinstance(result, StageResult) and result.skipped else "done"
        if getattr(result, "passed", True) is False:  # a check that ran and failed (verify) is not "done"
            outcome.status = "failed"
            outcome.detail = "; ".join(getattr(result, "problems", None) or [])[:200]
        if result is None and name == "bench":
            outcome.status, outcome.detail = "skipped", "no bench workloads in the config"
        return result

    @contextmanager
    def entered(self, name: str, context: AbstractContextManager[T], detail: Callable[[T], str]) -> Iterator[T]:
        """A stage whose result lives for a `with` block (deploy: the server runs until the block ends); timed
        until it is entered, like the other stages."""
        started = time.monotonic()
        outcome = StageOutcome(name, "failed")
        self.report.stages.append(outcome)
        with ExitStack() as stack:
            try:
                result = stack.enter_context(context)
            except Exception as exc:
                outcome.detail = _first_line(exc)
                raise
            finally:
                outcome.seconds = round(time.monotonic() - started, 2)
            outcome.status, outcome.detail = "done", detail(result)
            yield result


def _first_line(exc: BaseException) -> str:
    return (str(exc).splitlines() or [type(exc).__name__])[0][:200]


def _build(config: ForgeConfig, workdir: Path, checkpoint_dir: Path, force: bool) -> BuildResult:
    from trtllm_forge.builders.registry import build

    return build(config, workdir, checkpoint_dir, force=force)


def _smoke(config: ForgeConfig, deployment: Deployment, report: RunReport) -> None:
    from trtllm_forge.client import Generation, generate
    from trtllm_forge.deploy.kinds import Speaks
    from trtllm_forge.llmapi_requests import llmapi_generate

    entry = entry_model(config)
    # The llmapi model takes NVIDIA's llmapi tensors, the engine ensembles the tensorrt_llm ones; llmapi_generate
    # asks an OpenAI-speaking deployment the same over /v1/completions.
    openai = deployment.speaks is Speaks.OPENAI
    send: Callable[..., Generation] = llmapi_generate if is_llmapi(config) or openai else generate
    whole = send(deployment, SMOKE_PROMPT, config.verify.max_tokens, model=entry, stream=False)
    streamed = send(deployment, SMOKE_PROMPT, config.verify.max_tokens, model=entry, stream=True)
    report.answer = whole.text
    report.stream_matches = streamed.text == whole.text
    info(f"[bold]served answer[/bold] to {SMOKE_PROMPT!r}: {whole.text!r}")
    if not report.stream_matches:
        raise StepError("smoke", "the streamed text differs from the non-streamed text", f"streamed {streamed.text!r}")


def _bench(config: ForgeConfig, workdir: Path, deployment: Deployment) -> dict | None:
    if not config.bench.workloads:
        return None
    from trtllm_forge.bench.config_runs import fail_on_errors, options_from_config
    from trtllm_forge.bench.roofline_view import roofline_rows, roofline_table
    from trtllm_forge.bench.run import run_bench

    runs = options_from_config(config, workdir, {}, {}, None, config.name or "CONFIG", deployment=deployment)
    documents = [run_bench(options) for options in runs]
    rows = roofline_rows(config, documents)
    if rows:
        console.print(roofline_table(rows))
    fail_on_errors(documents)
    return {"workloads": documents, "roofline": rows}


def measure_host_once(config: ForgeConfig) -> None:
    """The CPU's roofline needs this machine's measured bandwidth and FLOP/s (a few seconds, kept in a cache);
    measured before the server starts so it does not compete with it."""
    from trtllm_forge.hardware import find_device

    device = find_device(config.hardware.gpu)
    if not config.bench.workloads or device is None or device.is_gpu or device.bandwidth_gb_s:
        return
    from trtllm_forge.plan.host import measure_host, store_host_profile

    path = store_host_profile(measure_host())
    info(f"measured this machine for the roofline (stored in {path}; `trtllm-forge plan --measure-host` redoes it)")


def run_pipeline(
    config: ForgeConfig,
    workdir: Path,
    *,
    force: bool = False,
    keep_serving: bool = False,
    run_verify: bool = True,
    run_bench: bool = True,
    report: RunReport | None = None,
) -> RunReport:
    """Run every stage; `report` (when given) is filled as the stages run, so a caller still has it after an error."""
    report = report if report is not None else RunReport(config.name or "config", workdir)
    with terminate_as_error("run", workdir):  # SIGTERM, like Ctrl-C, still stops the server and cleans up
        return _run_stages(config, workdir, report, force, keep_serving, run_verify, run_bench)


def _run_stages(
    config: ForgeConfig, workdir: Path, report: RunReport, force: bool, keep_serving: bool, run_verify: bool, run_bench: bool
) -> RunReport:
    from trtllm_forge.deploy.kinds import kind_of
    from trtllm_forge.importer.stage import import_checkpoint
    from trtllm_forge.render.repository import render_repository
    from trtllm_forge.verify.stage import verify_deployment

    stages = _Stages(report)
    try:
        imported = stages.run("import", import_checkpoint, config, workdir, force=force)
        built = stages.run("build", _build, config, workdir, imported.checkpoint_dir, force)
        rendered = stages.run("render", render_repository, config, workdir, built.engine_dir, force=force)
        report.paths = {
            "checkpoint": str(imported.checkpoint_dir),
            "engine": str(built.engine_dir or built.llmapi_dir),
            "repository": str(rendered.repository),
            "logs": str(workdir / "logs"),
        }
        if run_bench:
            measure_host_once(config)
        server = kind_of(config).serving(config, workdir, rendered.repository, keep=keep_serving)
        with stages.entered("deploy", server, lambda d: f"{d.where}, grpc {d.grpc_url}, http {d.http_url}") as deployment:
            report.deployment = deployment
            report.kept_serving = keep_serving
            stages.run("smoke", _smoke, config, deployment, report)
            if run_verify:
                report.verify = stages.run("verify", verify_deployment, config, workdir, deployment, imported, built)
            if run_bench:
                report.bench = stages.run("bench", _bench, config, workdir, deployment)
    except (ConfigError, StepError, KeyboardInterrupt):
        present(report, config)
        raise
    present(report, config)
    if not report.passed:
        problems = "; ".join(report.verify.problems) if report.verify else "a stage failed"
        raise StepError("run", problems, f"see {workdir / 'verify' / 'report.json'} and {workdir / 'logs'}")
    return report


def stage_table(report: RunReport) -> Table:
    table = Table(title=f"trtllm-forge run {report.config_name}", title_justify="left")
    table.add_column("stage")
    table.add_column("status")
    table.add_column("seconds", justify="right")
    table.add_column("detail")
    colours = {"done": "green", "skipped": "cyan", "failed": "red"}
    for stage in report.stages:
        colour = colours.get(stage.status, "white")
        table.add_row(stage.name, f"[{colour}]{stage.status}[/{colour}]", f"{stage.seconds:.1f}", plain(stage.detail))
    return table


def query_examples(config: ForgeConfig, deployment: Deployment) -> str:
    from trtllm_forge.deploy.kinds import kind_of

    return kind_of(config).query_examples(config, deployment)


def present(report: RunReport, config: ForgeConfig) -> None:
    console.print(stage_table(report))
    if report.answer is not None:
        console.print(f"[bold]The capital of France is[/bold]{report.answer}")
    for name, path in report.paths.items():
        console.print(f"  {name:11} {plain(path)}")
    if report.deployment is not None:
        if report.kept_serving:
            console.print(f"server running ({report.deployment.where}); stop it with `trtllm-forge deploy stop --workdir {report.workdir}`")
        else:
            console.print("server stopped; `trtllm-forge deploy CONFIG` (or `run --keep-serving`) serves it again, then")
        console.print(query_examples(config, report.deployment), markup=False)


def show_dry_run(config: ForgeConfig, config_file: Path, workdir: Path, as_json: bool) -> None:
    """What `run` would do. Import and build are planned exactly; later stages depend on the engine and are
    described by the commands that would run them."""
    import shlex

    from trtllm_forge.importer.stage import plan_import
    from trtllm_forge.ui import emit_json

    # The only caller (`run --dry-run`, commands/run_cmd.py) has refused a model.source that is not on this machine
    # (refuse_missing_inputs), so the import plan is made from the checkpoint itself; its refusals are the run's.
    import_plan = plan_import(config, workdir)
    import_doc = import_plan.to_json()
    checkpoint_dir = import_plan.checkpoint_dir
    from trtllm_forge.builders.registry import dry_run_commands

    build_plan, build_commands = dry_run_commands(config, workdir, checkpoint_dir)
    later = [
        ["trtllm-forge", "render", str(config_file), "--workdir", str(workdir)],
        ["trtllm-forge", "deploy", str(config_file), "--workdir", str(workdir)],
        ["trtllm-forge", "verify", str(config_file), "--workdir", str(workdir)],
        *([["trtllm-forge", "bench", str(config_file), "--workdir", str(workdir)]] if config.bench.workloads else []),
        ["trtllm-forge", "deploy", "stop", "--workdir", str(workdir)],
    ]
    doc: dict[str, Any] = {
        "dry_run": True,
        "workdir": str(workdir),
        "import": import_doc,
        "build": build_plan,
        "then": [shlex.join(argv) for argv in later],
    }
    if as_json:
        emit_json(doc)
        return
    info(f"[bold]run (dry run)[/bold] for {config.name} in {workdir}")
    for argv in doc["import"]["commands"] or [["(record the checkpoint", str(doc["import"]["checkpoint_dir"]) + ")"]]:
        info(f"1. import: {shlex.join(argv)}")
    for argv in build_commands:
        info(f"2. build: {shlex.join(argv)}")
    for index, argv in enumerate(later, start=3):
        info(f"{index}. {shlex.join(argv)}")
    info("dry run: nothing was run and nothing was written")
