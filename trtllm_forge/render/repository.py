"""`render_repository`: config + engine directory -> a validated Triton model repository in the workdir
(stage `render`: <wd>/render/model_repository, <wd>/render/launch.sh, launch argv in the manifest)."""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from trtllm_forge.builders.tensorrt_llm.images import check_engine_for_config
from trtllm_forge.config.schema import ForgeConfig
from trtllm_forge.deploy.discovery import TritonInstall, prepare_backend_dir, pytriton_install
from trtllm_forge.engine_config import EngineInfo, read_engine_config
from trtllm_forge.errors import ConfigError
from trtllm_forge.render import launch as launch_mod
from trtllm_forge.render import stub_env
from trtllm_forge.render.draft import DraftEngine, drafts, locate_draft_engine
from trtllm_forge.render.other_kinds import write_llmapi_repository, write_vllm_repository
from trtllm_forge.render.templates import templates_root, write_engine_repository
from trtllm_forge.render.validate import Problem, check_repository, raise_on_errors
from trtllm_forge.render.values import ENGINE_KINDS, choose_kind, compute_values
from trtllm_forge.stage_results import BuildResult, RenderResult
from trtllm_forge.stages import StageRecorder, replace_directory, run_stage

STAGE = "render"
REPOSITORY = "model_repository"
LAUNCH_SCRIPT = "launch.sh"
BACKENDS = "backends"


@dataclass
class RenderedRepository:
    kind: str
    repository: Path
    files: list[Path]
    models: list[str]
    warnings: list[str] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    world_size: int = 1
    engine_models: tuple[str, ...] = ()  # the TensorRT-LLM models every MPI leader-mode rank loads


def default_engine_dir(workdir: Path) -> Path | None:
    """The engine the workdir's build stage recorded, else <workdir>/build/engine (an engine put there by hand)."""
    built = BuildResult.in_workdir(workdir)
    candidate = built.engine_dir if built and built.engine_dir else workdir / "build" / "engine"
    return candidate if (candidate / "config.json").is_file() else None


def resolve_engine(config: ForgeConfig, workdir: Path, engine_dir: Path | None, kind: str) -> EngineInfo | None:
    if kind not in ENGINE_KINDS:
        if engine_dir is None and kind == "llmapi" and config.engine.backend == "openvino":
            engine_dir = default_engine_dir(workdir)  # the CPU stand-in serves the build stage's OpenVINO IR
        return read_engine_config(Path(engine_dir).resolve()) if engine_dir else None
    engine_dir = engine_dir or default_engine_dir(workdir)
    if engine_dir is None:
        raise ConfigError(
            "--engine-dir",
            f"no engine given and {workdir / 'build' / 'engine'} has no config.json",
            "run `trtllm-forge build-engine CONFIG` first or pass --engine-dir DIR",
        )
    engine = read_engine_config(Path(engine_dir).resolve())
    if engine.backend == "tensorrt-llm":
        check_engine_for_config(config, engine.version)  # an engine loads only in an image of its own TensorRT-LLM
    return engine


def write_repository(
    config: ForgeConfig, workdir: Path, engine: EngineInfo | None, kind: str, out: Path, draft: DraftEngine | None = None
) -> RenderedRepository:
    """Render into `out` (which must not hold another repository) and validate the result. `draft`: the draft
    engine of a draft-target config (default: the one `locate_draft_engine` finds)."""
    out.mkdir(parents=True, exist_ok=True)
    engine_models: tuple[str, ...]
    if kind in ENGINE_KINDS:
        assert engine is not None  # resolve_engine() returns one for every engine kind
        if draft is None and drafts(config, kind):
            draft = locate_draft_engine(workdir, engine.directory)
        values = compute_values(config, workdir, engine, kind, draft)
        files = write_engine_repository(values, out)
        warnings, world_size = values.warnings, engine.world_size
        engine_models = (values.names["tensorrt_llm"],) + ((values.draft.name,) if values.draft else ())
    elif kind == "llmapi":
        files, warnings = write_llmapi_repository(config, workdir, out, engine.directory if engine else None)
        world_size, engine_models = 1, (config.triton.model_names.tensorrt_llm,)
    else:
        files, warnings = write_vllm_repository(config, workdir, out)
        world_size, engine_models = 1, ()
    problems = check_repository(out)
    raise_on_errors(problems)
    models = sorted(p.name for p in out.iterdir() if p.is_dir())
    return RenderedRepository(kind, out, files, models, warnings, problems, world_size, engine_models)


def wheel_server(config: ForgeConfig, kind: str) -> TritonInstall | None:
    """The Triton carried by nvidia-pytriton, which only the cpu kind runs on (python backend only), when it is
    installed with a stub for this Python; None renders the container's command."""
    on_cpu = kind == "cpu" or (kind == "llmapi" and config.engine.backend == "openvino")  # the LLM-API stand-in
    if config.deploy.target != "local" or not on_cpu:
        return None
    install = pytriton_install()
    return install if install is not None and install.stub is not None and install.stub.is_file() else None


def launch_plan_for(
    config: ForgeConfig, rendered: RenderedRepository, repository: Path, install: TritonInstall | None, backend_dir: Path | None
) -> launch_mod.LaunchPlan:
    return launch_mod.plan_launch(
        config, repository, world_size=rendered.world_size, engine_models=rendered.engine_models, backend_dir=backend_dir, install=install
    )


def stage_inputs(config: ForgeConfig, engine: EngineInfo | None, kind: str, draft: DraftEngine | None = None) -> tuple[dict, dict]:
    values = {"kind": kind, "config": config.model_dump(mode="json"), "python_env": str(stub_env.project_env())}
    paths = {"templates": templates_root()}
    if engine is not None:
        paths["engine_config"] = engine.directory / "config.json"
        values["engine_dir"] = str(engine.directory.resolve())
    if draft is not None:
        values["draft_engine_dir"] = str(draft.directory)
        if draft.info is not None:
            paths["draft_engine_config"] = draft.directory / "config.json"
    return values, paths


def render_repository(
    config: ForgeConfig, workdir: Path, engine_dir: Path | None, kind: str | None = None, force: bool = False
) -> RenderResult:
    """Render, validate and record the repository in <workdir>/render (skipped when inputs are unchanged)."""
    workdir = Path(workdir).resolve()
    kind = choose_kind(config, kind)
    engine = resolve_engine(config, workdir, Path(engine_dir) if engine_dir else None, kind)
    draft = locate_draft_engine(workdir, engine.directory) if engine is not None and drafts(config, kind) else None
    final = workdir / STAGE
    values, paths = stage_inputs(config, engine, kind, draft)

    def body(tmp: Path, recorder: StageRecorder) -> dict:
        rendered = write_repository(config, workdir, engine, kind, tmp / REPOSITORY, draft)
        recorder.notes.extend(rendered.warnings)
        recorder.notes.extend(f"{p.file}:{p.line}: {p.message}" for p in rendered.problems)
        install = wheel_server(config, kind)
        backend_dir = final / BACKENDS if install and prepare_backend_dir(install, tmp / BACKENDS) else None
        plan = launch_plan_for(config, rendered, final / REPOSITORY, install, backend_dir)
        (tmp / LAUNCH_SCRIPT).write_text(plan.script())
        (tmp / LAUNCH_SCRIPT).chmod(0o755)
        return {
            "kind": kind,
            "repository": str(final / REPOSITORY),
            "models": rendered.models,
            "launch_command": plan.argv,
            "launch_env": plan.env,
            "launch_script": str(final / LAUNCH_SCRIPT),
            "world_size": plan.world_size,
            "engine_dir": str(engine.directory.resolve()) if engine else None,
            "warnings": rendered.warnings + [f"{p.file}:{p.line}: {p.message}" for p in rendered.problems],
        }

    return RenderResult.from_stage(run_stage(workdir, STAGE, values, paths, body, force=force))


def render_to_directory(config: ForgeConfig, workdir: Path, engine_dir: Path | None, kind: str | None, out: Path) -> RenderedRepository:
    """Render into `out` (replaced atomically) without a stage manifest: for --out."""
    workdir = Path(workdir).resolve()
    kind = choose_kind(config, kind)
    engine = resolve_engine(config, workdir, Path(engine_dir) if engine_dir else None, kind)
    out = Path(out).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.tmp-"))
    try:
        rendered = write_repository(config, workdir, engine, kind, tmp)
        replace_directory(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    rendered.repository = out
    rendered.files = [out / f.relative_to(tmp) for f in rendered.files]
    return rendered


def dry_run(config: ForgeConfig, workdir: Path, engine_dir: Path | None, kind: str | None, out: Path | None) -> dict:
    """What render would write and run, computed in a scratch directory outside the workdir."""
    workdir = Path(workdir).resolve()
    kind = choose_kind(config, kind)
    engine = resolve_engine(config, workdir, Path(engine_dir) if engine_dir else None, kind)
    target = Path(out).resolve() if out else workdir / STAGE / REPOSITORY
    with tempfile.TemporaryDirectory(prefix="forge-render-dry-") as scratch:
        rendered = write_repository(config, workdir, engine, kind, Path(scratch) / REPOSITORY)
        files = sorted(str(target / f.relative_to(Path(scratch) / REPOSITORY)) for f in rendered.files)
    install = wheel_server(config, kind)
    plan = launch_plan_for(config, rendered, target, install, workdir / STAGE / BACKENDS if install else None)
    commands: list[list[str]] = []
    return {
        "kind": kind,
        "repository": str(target),
        "commands": commands,
        "files": files + ([] if out else [str(workdir / STAGE / LAUNCH_SCRIPT), str(workdir / STAGE / "manifest.json")]),
        "launch_command": plan.argv,
        "launch_env": plan.env,
        "warnings": rendered.warnings,
    }
