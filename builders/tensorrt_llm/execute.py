"""Run a build plan: dry-run output, the missing-GPU/TensorRT-LLM refusal with its container command, and the
real execution (logged subprocesses in a temporary build dir, renamed into place, recorded in manifest.json)."""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
import time
from pathlib import Path
from typing import Any

import click
import yaml
from rich.markup import escape
from trtllm_forge.builders.tensorrt_llm import container, images, modelopt
from trtllm_forge.builders.tensorrt_llm.calibration import prepare_calibration
from trtllm_forge.builders.tensorrt_llm.engine_fixture import expected_engine_config
from trtllm_forge.builders.tensorrt_llm.plan import BuildPlan, plan_build
from trtllm_forge.builders.tensorrt_llm.plugins import preload_value, sha256_of
from trtllm_forge.builders.tensorrt_llm.spec import load_spec

from trtllm_forge.config.schema import ForgeConfig
from trtllm_forge.engine_config import ENGINE_CONFIG
from trtllm_forge.errors import ConfigError, StepError
from trtllm_forge.importer.prequantized import HF_QUANT_CONFIG, check_declared, read_prequantized
from trtllm_forge.stage_results import BuildResult
from trtllm_forge.stages import StageRecorder, StageResult, run_stage, write_json_atomic
from trtllm_forge.ui import emit_json, info, warn

STAGE = "build"
# Lines of trtllm-build output worth keeping in the manifest (regex → manifest key).
LOG_METRICS = {
    r"Total time of building all engines:\s*(\S+)": "build_time",
    r"Build phase peak memory:\s*([\d.]+\s*\w+)": "build_peak_host_memory",
    r"[Ee]ngine size[^:]*:\s*([\d.]+\s*\w+)": "engine_size",
    r"Serialized engine size[^:]*:\s*([\d.]+\s*\w+)": "engine_size",
    r"peak GPU memory[^:]*:\s*([\d.]+\s*\w+)": "build_peak_gpu_memory",
}


def container_command(config: ForgeConfig, plan: BuildPlan, workdir: Path) -> dict:
    spec = load_spec(plan.trtllm_version)
    host_paths = [plan.model_dir]
    if config.config_dir:
        host_paths.append(str(config.config_dir))
    if plan.draft:
        host_paths.append(plan.draft["model_dir"])
    if config.engine.speculative.draft_model:
        host_paths.append(str(config.resolve_path(config.engine.speculative.draft_model)))
    if plan.calibration_source:
        host_paths.append(plan.calibration_source)
    host_paths += [p.path for p in plan.custom_plugins]
    run = container.docker_run_argv(config, config.config_file, workdir, host_paths, plan.trtllm_version)
    build = container.docker_build_argv(spec.base_image, plan.trtllm_version)
    return {"image": container.image_tag(plan.trtllm_version), "base_image": spec.base_image, "docker_build": build, "docker_run": run}


def _print_dry_run(plan: BuildPlan, workdir: Path, commands: dict, as_json: bool) -> None:
    build_dir = workdir / STAGE
    if as_json:
        document = {"dry_run": True, "stage": STAGE, "build_dir": str(build_dir), "plan": plan.to_dict(), "container": commands}
        if plan.target == "engine":
            document["expected_engine_config"] = expected_engine_config(plan) if plan.shape else None
        emit_json(document)
        return
    # click.echo, not rich: commands must stay on one line to be copied
    click.echo(plan.render_text(build_dir), err=True)
    click.echo("in the container (build the image once from the repository root, then run):", err=True)
    click.echo(f"  $ {shlex.join(commands['docker_build'])}", err=True)
    click.echo(f"  $ {shlex.join(commands['docker_run'])}", err=True)
    click.echo("dry run: nothing was run and nothing was written", err=True)


class TensorRTLLMEngineBuilder:
    """engine.target engine: trtllm-build engines in the TensorRT-LLM 1.2.x container; implements
    builders.protocol.Builder. Without TensorRT-LLM or a GPU, `execute` refuses with the container command."""

    def plan(self, config: ForgeConfig, workdir: Path, checkpoint_dir: Path | None) -> BuildPlan:
        return plan_build(config, checkpoint_dir, Path(workdir))

    def commands(self, plan: BuildPlan) -> list[list[str]]:
        return [list(step.argv) for step in plan.steps]

    def describe(self, plan: BuildPlan) -> dict[str, Any]:
        return plan.to_dict()

    def show_dry_run(self, config: ForgeConfig, workdir: Path, plan: BuildPlan, as_json: bool) -> None:
        _warn(plan)
        _print_dry_run(plan, Path(workdir), container_command(config, plan, Path(workdir)), as_json)

    def execute(self, config: ForgeConfig, workdir: Path, plan: BuildPlan, force: bool = False) -> BuildResult:
        workdir = Path(workdir)
        _warn(plan)
        commands = container_command(config, plan, workdir)
        spec = load_spec(plan.trtllm_version)
        serving = images.image_for_version(plan.trtllm_version)
        # Where nvidia-smi exists, the images this engine is built and served in must start on this driver.
        driver = images.check_host_driver(serving)
        runtime = container.probe()
        missing = runtime.missing(plan.trtllm_version, spec.compatible_versions)
        if missing:
            raise ConfigError(
                "engine.backend",
                f"tensorrt-llm build cannot run here: {missing}",
                f"run the same build in {spec.container_image} (docker/Dockerfile on {spec.base_image}, which serves the engine): "
                f"{shlex.join(commands['docker_build'])} && {shlex.join(commands['docker_run'])}",
            )
        return BuildResult.from_stage(_execute(config, plan, workdir, runtime, force, driver))


def _warn(plan: BuildPlan) -> None:
    if plan.target == "engine":
        info(escape(f"note: {images.LEGACY_ENGINE_PATH}"))
    for item in plan.warnings:
        warn(escape(f"{item.field}: {item.message} [{item.code}]"))


def build(
    config: ForgeConfig, workdir: Path, checkpoint_dir: Path | None, force: bool = False, dry_run: bool = False, as_json: bool = False
) -> BuildResult | BuildPlan:
    """Plan, check and (when TensorRT-LLM 1.2.x and a GPU are here) run the build stage, through the registry's
    builder of the config's engine.target (this one or builders/tensorrt_llm/llmapi.py's LLMAPIBuilder).

    dry_run: print the plan (text on stderr, or one JSON document on stdout) and return it; nothing is written.
    Without TensorRT-LLM or a GPU: ConfigError (exit 2) carrying the container command; nothing is written.
    """
    from trtllm_forge.builders.registry import builder_for, report_build

    builder = builder_for(config)
    # Without an imported checkpoint the plan reads model.source (a path that may exist only on the GPU host).
    plan = builder.plan(config, Path(workdir), Path(checkpoint_dir) if checkpoint_dir else config.resolve_path(config.model.source))
    if dry_run:
        builder.show_dry_run(config, Path(workdir), plan, as_json)
        return plan
    result = builder.execute(config, Path(workdir), plan, force=force)
    report_build(result, as_json)
    return result


def write_llmapi(plan: BuildPlan, workdir: Path, force: bool) -> BuildResult:
    """engine.target llmapi: the PyTorch-backend files (no engine) as the build stage, after ModelOpt's export when the
    plan quantizes (run here on a GPU with ModelOpt; its absolute path is recorded and model.yaml loads it)."""
    quantize = plan.llmapi.get("quantize")

    def body(tmp: Path, recorder: StageRecorder) -> dict:
        outputs: dict[str, Any] = {}
        if quantize:
            outputs["quantized_checkpoint"] = _quantized_checkpoint(plan, quantize, recorder, tmp)
            outputs["quantize_image"] = quantize["image"]
        out = tmp / "llmapi"
        out.mkdir()
        (out / "model.yaml").write_text(yaml.safe_dump(plan.llmapi["model_yaml"], sort_keys=False))
        (out / "extra_llm_api_options.yaml").write_text(yaml.safe_dump(plan.llmapi["extra_llm_api_options"], sort_keys=False))
        write_json_atomic(out / "serve.json", {"argv": plan.llmapi["serve_argv"], "cwd": str(workdir / STAGE)})
        write_json_atomic(tmp / "plan.json", plan.to_dict())
        recorder.notes += [f"{w.code}: {w.message}" for w in plan.warnings]
        final = workdir / STAGE / "llmapi"
        return {
            "target": "llmapi",
            "llmapi_dir": str(final),
            "model_yaml": str(final / "model.yaml"),
            "extra_llm_api_options": str(final / "extra_llm_api_options.yaml"),
            "serve_argv": plan.llmapi["serve_argv"],
            "prequantized": plan.llmapi.get("prequantized"),
            **outputs,
        }

    values = _stage_values(plan)
    if quantize:
        values["quantized_files"] = _fingerprint(Path(quantize["export_dir"]))
    return BuildResult.from_stage(run_stage(workdir, STAGE, values, _input_paths(plan), body, force=force))


def _quantized_checkpoint(plan: BuildPlan, quantize: dict[str, Any], recorder: StageRecorder, tmp: Path) -> str:
    """The ModelOpt export the plan names: run it when it is not there yet (LLMAPIBuilder.execute checked that it can
    run here), then check that it says the planned format."""
    export = Path(quantize["export_dir"])
    if not modelopt.export_complete(export):
        for step in plan.steps:
            if step.name == "modelopt-fetch" and Path(quantize["examples_dir"]).is_dir():
                continue
            if step.tool in ("git", "hf_ptq.py"):
                info(escape(f"{step.name}: {step.description}"))
                started = time.monotonic()
                recorder.run(step.argv, step.name, cwd=tmp)
                recorder.timed(step.name, time.monotonic() - started)
    found = read_prequantized(export)
    if found is None or not modelopt.export_complete(export):
        raise StepError(
            "modelopt-quantize",
            f"{export} holds no complete ModelOpt export ({HF_QUANT_CONFIG} and config.json's quantization_config) after the quantization",
            "see its log under logs/",
        )
    check_declared(found, plan.quant.algorithm)
    recorder.notes.append(f"quantized checkpoint: {export} ({found.quant_algo}, {found.producer or 'producer not named'})")
    return str(export)


def _stage_values(plan: BuildPlan) -> dict:
    data = plan.to_dict()
    data.pop("warnings", None)
    data["checkpoint_files"] = _fingerprint(Path(plan.model_dir))
    return data


def _fingerprint(directory: Path) -> list:
    """Names, sizes and mtimes of the checkpoint files: hashing hundreds of GB of weights per run is too slow."""
    if not directory.is_dir():
        return []
    return [[str(p.relative_to(directory)), p.stat().st_size, int(p.stat().st_mtime)] for p in sorted(directory.rglob("*")) if p.is_file()]


def _input_paths(plan: BuildPlan) -> dict[str, Path]:
    paths = {"checkpoint_config": Path(plan.model_dir) / "config.json"}
    if plan.calibration_source:
        paths["calibration"] = Path(plan.calibration_source)
    for index, plugin in enumerate(plan.custom_plugins):
        paths[f"plugin{index}"] = Path(plugin.path)
    return paths


def parse_build_log(text: str) -> dict[str, str]:
    found: dict[str, str] = {}
    for pattern, key in LOG_METRICS.items():
        matches = re.findall(pattern, text)
        if matches:
            found[key] = matches[-1].strip()
    return found


def diff_engine_config(expected: dict, actual: dict) -> list[str]:
    """Differences between what the plan predicted and what the engine recorded (build_config only)."""
    out = []
    exp, act = expected.get("build_config", {}), actual.get("build_config", {})
    for key in ("max_input_len", "max_seq_len", "max_batch_size", "max_num_tokens", "max_draft_len"):
        if key in act and exp.get(key) != act.get(key):
            out.append(f"build_config.{key}: planned {exp.get(key)}, engine has {act.get(key)}")
    for key in ("use_paged_context_fmha", "use_fp8_context_fmha", "reduce_fusion", "use_fused_mlp", "context_fmha"):
        e, a = exp.get("plugin_config", {}).get(key), act.get("plugin_config", {}).get(key)
        if a is not None and bool(e) != bool(a):
            out.append(f"plugin_config.{key}: planned {e}, engine has {a}")
    return out


def serving_record(trtllm_version: str, driver: str | None) -> dict:
    """What the engine manifest says about the image that must serve it (spec/serving-images.json)."""
    row = images.image_for_version(trtllm_version)
    return {
        "image": row.image,
        "route": row.how,
        "base_image": row.base_image,
        "tensorrt_llm": row.tensorrt_llm,
        "tensorrt": row.tensorrt,
        "cuda": row.cuda,
        "min_driver": row.min_driver,
        "driver_seen": driver,
        "sources": list(row.sources),
    }


def _execute(
    config: ForgeConfig, plan: BuildPlan, workdir: Path, runtime: container.Runtime, force: bool, driver: str | None = None
) -> StageResult:
    def body(tmp: Path, recorder: StageRecorder) -> dict:
        recorder.tool_versions["tensorrt_llm"] = str(runtime.trtllm_version)
        if driver:
            recorder.tool_versions["nvidia_driver"] = driver
        recorder.tool_versions["gpus"] = "; ".join(runtime.gpus)
        if not any(_gpu_matches(plan.gpu, name) for name in runtime.gpus):
            recorder.notes.append(f"engines are tied to the GPU model: built on {runtime.gpus} for hardware.gpu {plan.gpu}")
            warn(
                escape(
                    f"hardware.gpu is {plan.gpu} but the visible GPUs are {runtime.gpus}: engines only run on the GPU model they were built on"
                )
            )
        write_json_atomic(tmp / "plan.json", plan.to_dict())
        total = len(plan.steps)
        for index, step in enumerate(plan.steps, 1):
            info(escape(f"[{index}/{total}] {step.name}: {step.description}"))
            started = time.monotonic()
            if step.name == "prepare-calibration":
                written = prepare_calibration(Path(step.argv[1]), tmp / step.argv[2], int(step.argv[3]))
                recorder.notes.append(f"calibration: {written} samples from {step.argv[1]}")
            else:
                env = dict(step.env)
                if "LD_PRELOAD" in env:
                    env["LD_PRELOAD"] = preload_value(plan.custom_plugins, base=tmp)
                record = recorder.run(step.argv, step.name, env=env, cwd=tmp)
                if step.tool == "trtllm-build":
                    metrics = parse_build_log(Path(record.log).read_text(errors="replace"))
                    recorder.notes += [f"{step.name} {k}: {v}" for k, v in metrics.items()]
            recorder.timed(step.name, time.monotonic() - started)
        engine_config = json.loads((tmp / "engine" / ENGINE_CONFIG).read_text())
        built_version = str(engine_config.get("version"))
        if built_version != plan.trtllm_version:
            message = (
                f"engine built by TensorRT-LLM {built_version} but serving is pinned to {plan.trtllm_version} "
                f"({plan.container_image}); engines load only with the TensorRT-LLM/TensorRT they were built with"
            )
            recorder.notes.append(message)
            warn(escape(message))
        for line in diff_engine_config(expected_engine_config(plan), engine_config) if plan.shape else []:
            recorder.notes.append(f"adjusted by trtllm-build: {line}")
            warn(escape(f"adjusted by trtllm-build: {line}"))
        plugins = []
        for plugin in plan.custom_plugins:
            lib = Path(plugin.library) if Path(plugin.library).is_absolute() else tmp / plugin.library
            if not lib.is_file():
                raise StepError(
                    "engine.plugins.custom_libraries", f"{lib} does not exist after the build", "check the plugin path or its CMake recipe"
                )
            final_lib = lib if Path(plugin.library).is_absolute() else workdir / STAGE / plugin.library
            plugins.append({"path": str(final_lib), "source": plugin.path, "sha256": sha256_of(lib)})
        final = workdir / STAGE
        outputs = {
            "target": "engine",
            "engine_dir": str(final / "engine"),
            "checkpoint_dir": str(final / "checkpoint"),
            "trtllm_version": built_version,
            "container_image": plan.container_image,
            "serving_image": serving_record(plan.trtllm_version, driver),
            "custom_plugins": plugins,
            "ld_preload": ":".join(p["path"] for p in plugins),
            "warnings": [w.to_dict() for w in plan.warnings],
        }
        if plan.draft:
            outputs["draft_engine_dir"] = str(final / plan.draft["engine_dir"])
        return outputs

    return run_stage(workdir, STAGE, _stage_values(plan), _input_paths(plan), body, force=force)


def _gpu_matches(wanted: str, smi_line: str) -> bool:
    key = wanted.lower().replace("-", " ").split()[0]
    return key in smi_line.lower()


class LLMAPIBuilder(TensorRTLLMEngineBuilder):
    """engine.target llmapi on TensorRT-LLM: no engine; writes model.yaml, the extra LLM-API options and the
    trtllm-serve argv as the build stage. Plans and dry-runs like the engine builder (plan_build plans both targets)."""

    def show_dry_run(self, config: ForgeConfig, workdir: Path, plan: BuildPlan, as_json: bool) -> None:
        _warn(plan)
        quantize = plan.llmapi.get("quantize")
        fetch = next((step.argv for step in plan.steps if step.name == "modelopt-fetch"), None)
        commands = {"image": quantize["image"], "fetch": fetch, "docker_run": quantize["docker_run"]} if quantize else None
        if as_json:
            emit_json(
                {"dry_run": True, "stage": STAGE, "build_dir": str(Path(workdir) / STAGE), "plan": plan.to_dict(), "container": commands}
            )
            return
        click.echo(plan.render_text(Path(workdir) / STAGE), err=True)
        if commands:
            click.echo(f"ModelOpt's step on a GPU host, in {commands['image']}:", err=True)
            click.echo(f"  $ {shlex.join(fetch or [])}", err=True)
            click.echo(f"  $ {shlex.join(commands['docker_run'])}", err=True)
        click.echo("dry run: nothing was run and nothing was written", err=True)

    def execute(self, config: ForgeConfig, workdir: Path, plan: BuildPlan, force: bool = False) -> BuildResult:
        _warn(plan)
        quantize = plan.llmapi.get("quantize")
        if quantize and not modelopt.export_complete(Path(quantize["export_dir"])):
            missing = _modelopt_missing()
            if missing:
                fetch = next(step.argv for step in plan.steps if step.name == "modelopt-fetch")
                raise ConfigError(
                    "quantization.algorithm",
                    f"{config.quantization.algorithm} is ModelOpt's quantization on a GPU, which cannot run here: {missing}",
                    f"run it in {quantize['image']}: {shlex.join(fetch)} && {shlex.join(quantize['docker_run'])}, then build again "
                    f"(the export at {quantize['export_dir']} is picked up)",
                )
        return write_llmapi(plan, Path(workdir), force)


def _modelopt_missing() -> str | None:
    """Why ModelOpt's quantization cannot run in this environment (None when it can)."""
    problems = []
    if importlib.util.find_spec("modelopt") is None:
        problems.append("ModelOpt is not installed (no modelopt module)")
    if not container.visible_gpus():
        problems.append("no NVIDIA GPU is visible (nvidia-smi -L lists none)")
    return " and ".join(problems) or None
