"""The build plan: from a resolved config to the ordered steps (exact argv), files and warnings of a
TensorRT-LLM 1.2.x engine build, checked against the spec before anything runs.

Every step runs with the build directory as its working directory and names its outputs relative to it,
so the argv shown by --dry-run is exactly the argv that runs (inside a temporary directory that is
renamed into place on success).
"""

from __future__ import annotations

import os
import shlex
from dataclasses import asdict, dataclass, field
from pathlib import Path

from trtllm_forge.builders.tensorrt_llm import images, llmapi, modelopt
from trtllm_forge.builders.tensorrt_llm.adjust import (
    EAGLE_MAX_NON_LEAVES,
    EAGLE_NUM_LAYERS,
    Effective,
    PlanWarning,
    effective_build,
)
from trtllm_forge.builders.tensorrt_llm.container import build_gpus
from trtllm_forge.builders.tensorrt_llm.plugins import CustomPlugin, custom_plugins, draft_plugin_flags, plugin_flags, preload_value
from trtllm_forge.builders.tensorrt_llm.quant import CONVERT_WEIGHT_ONLY, QuantChoice, capability_problems, choose, plain, sm_of
from trtllm_forge.builders.tensorrt_llm.rules import build_refusals, family_of
from trtllm_forge.builders.tensorrt_llm.spec import TOOL_TABLES, Spec, load_spec

from trtllm_forge.config.checks import shape_for
from trtllm_forge.config.schema import ForgeConfig, ParallelConfig
from trtllm_forge.dtypes import resolve_model_dtype
from trtllm_forge.errors import ConfigError, ConfigErrors
from trtllm_forge.hardware import Device, find_device
from trtllm_forge.importer.prequantized import PreQuantized, check_declared, read_prequantized
from trtllm_forge.model_shape import ModelShape

PYTHON = "python3"
CALIBRATION_DIR = "calibration"
# The draft engine of draft-target decoding, in the build stage beside `engine/` (render finds it here too).
DRAFT_ENGINE_DIR = "draft/engine"
# Offline switches for everything that could reach a hub during quantization.
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
# Names that TensorRT-LLM's calibration loader treats as hub datasets even when they are local paths.
HUB_DATASET_MARKERS = ("cnn_dailymail", "pileval", "scienceqa", "science_qa")


@dataclass
class Step:
    name: str
    tool: str  # a key of spec.TOOL_TABLES (trtllm-build, quantize.py, convert_checkpoint.py, ...) | cmake | internal | git | hf_ptq.py
    argv: list[str]
    outputs: list[str]
    description: str
    env: dict[str, str] = field(default_factory=dict)

    @property
    def internal(self) -> bool:
        return self.tool == "internal"

    def shell(self) -> str:
        prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()))
        return (prefix + " " if prefix else "") + shlex.join(self.argv)


@dataclass
class BuildPlan:
    config_name: str
    target: str  # engine | llmapi
    trtllm_version: str
    container_image: str
    gpu: str
    sm: int
    architecture: str
    dtype: str
    model_dir: str
    tp: int
    pp: int
    quant: QuantChoice
    steps: list[Step]
    files: dict[str, str]  # path relative to the build dir → what it is
    warnings: list[PlanWarning]
    effective: Effective | None
    requested: dict
    build_flags: dict[str, str]  # trtllm-build flag → value ("" for store_true flags)
    custom_plugins: list[CustomPlugin]
    calibration_source: str | None
    llmapi: dict
    shape: ModelShape | None = None
    draft: dict | None = None

    @property
    def world_size(self) -> int:
        return self.tp * self.pp

    @property
    def engine_dir(self) -> str:
        return "engine"

    def to_dict(self) -> dict:
        return {
            "config": self.config_name,
            "target": self.target,
            "trtllm_version": self.trtllm_version,
            "container_image": self.container_image,
            "gpu": self.gpu,
            "sm": self.sm,
            "architecture": self.architecture,
            "dtype": self.dtype,
            "model_dir": self.model_dir,
            "parallel": {"tp": self.tp, "pp": self.pp, "world_size": self.world_size},
            "quantization": asdict(self.quant),
            "steps": [
                {"name": s.name, "tool": s.tool, "argv": s.argv, "env": s.env, "outputs": s.outputs, "description": s.description}
                for s in self.steps
            ],
            "files": self.files,
            "warnings": [w.to_dict() for w in self.warnings],
            "requested": self.requested,
            "effective": asdict(self.effective) if self.effective else None,
            "custom_plugins": [asdict(p) for p in self.custom_plugins],
            "calibration_source": self.calibration_source,
            "draft": self.draft,
            "llmapi": self.llmapi,
        }

    def render_text(self, build_dir: Path | None = None) -> str:
        where = str(build_dir) if build_dir else "<workdir>/build"
        lines = [
            f"TensorRT-LLM {self.trtllm_version} build plan for {self.config_name} ({self.target}) on {self.gpu} (SM {self.sm}), "
            f"{self.architecture}, {self.dtype}, tp {self.tp} x pp {self.pp}, "
            f"quant {self.quant.quant_algo or 'none'} / KV {self.quant.kv_cache_quant_algo or 'none'}",
            f"container: {self.container_image}",
            f"steps (run in {where}):",
        ]
        for index, step in enumerate(self.steps, 1):
            lines.append(f"  {index}. {step.name}: {step.description}")
            lines.append(f"     $ {step.shell()}")
        lines.append("files:")
        lines += [f"  {path}  ({what})" for path, what in self.files.items()]
        if self.warnings:
            lines.append("warnings (what trtllm-build would change or risk, computed before the build):")
            lines += [f"  [{w.code}] {w.field}: {w.message}" for w in self.warnings]
        return "\n".join(lines)


def examples_dir(spec: Spec) -> str:
    return os.environ.get(spec.data["examples"]["env"]) or spec.data["examples"]["default_dir"]


def _script(spec: Spec, key: str) -> str:
    return f"{examples_dir(spec)}/{spec.data['examples']['scripts'][key]}"


def model_source(config: ForgeConfig, checkpoint_dir: Path | None) -> Path:
    """The imported checkpoint when it exists here; otherwise model.source, a path on the GPU host."""
    if checkpoint_dir is not None and Path(checkpoint_dir).is_dir():
        return Path(checkpoint_dir)
    return config.resolve_path(config.model.source)


def _family(config: ForgeConfig, shape: ModelShape | None, device: Device, spec: Spec) -> str:
    """The model family, once the shared rules (rules.py, also run when the config is loaded) found nothing to refuse."""
    quant = config.quantization
    problems = build_refusals(config, shape, device, choose(quant.algorithm, quant.kv_cache, spec))
    if problems:
        raise ConfigErrors(problems) if len(problems) > 1 else problems[0]
    family = family_of(config, shape)
    assert family is not None  # build_refusals refuses an unknown family
    return family


def _calibration_step(config: ForgeConfig, choice: QuantChoice, warnings: list[PlanWarning]) -> tuple[Step | None, str | None]:
    if not choice.needs_calibration:
        return None, None
    calib = config.quantization.calibration
    assert calib.dataset is not None  # rules.py build_refusals refuses calibration without data
    source = str(config.resolve_path(calib.dataset))
    if any(marker in source.lower() for marker in HUB_DATASET_MARKERS):
        warnings.append(
            PlanWarning(
                "calibration_name_quirk",
                "quantization.calibration.dataset",
                f"TensorRT-LLM treats paths containing a hub dataset name as that hub dataset; {source} is copied to "
                f"./{CALIBRATION_DIR}/train.jsonl so nothing is downloaded",
            )
        )
    step = Step(
        name="prepare-calibration",
        tool="internal",
        argv=["trtllm-forge:prepare-calibration", source, f"{CALIBRATION_DIR}/train.jsonl", str(calib.size)],
        outputs=[f"{CALIBRATION_DIR}/train.jsonl"],
        description=f"copy {calib.size} local samples into a datasets directory (train split, 'text' column)",
    )
    return step, source


def _quantize_step(
    config: ForgeConfig, choice: QuantChoice, model_dir: str, dtype: str, out: str, spec: Spec, warnings: list[PlanWarning]
) -> Step:
    calib = config.quantization.calibration
    size = calib.size
    cap = spec.adjustments["awq_calib_size_cap"]
    if choice.quant_algo in spec.adjustments["awq_algos"] and size > cap:
        warnings.append(
            PlanWarning(
                "awq_calib_size_clamped",
                "quantization.calibration.size",
                f"quantize.py clamps the calibration size to {cap} for AWQ formats (asked for {size})",
            )
        )
    assert choice.qformat is not None  # a quantize step is planned only for a format quantize.py writes
    argv = [PYTHON, _script(spec, "quantize"), "--model_dir", model_dir, "--dtype", dtype, "--qformat", choice.qformat]
    if choice.kv_cache != "none":
        argv += ["--kv_cache_dtype", choice.kv_cache]
    argv += [
        "--calib_dataset",
        f"./{CALIBRATION_DIR}",
        "--calib_size",
        str(size),
        "--calib_max_seq_length",
        str(calib.seq_len),
        "--batch_size",
        "1",
        "--tp_size",
        str(config.parallel.tp),
        "--pp_size",
        str(config.parallel.pp),
        "--device",
        "cuda",
        "--output_dir",
        out,
    ]
    if choice.quant_algo in spec.adjustments["awq_algos"]:
        argv += ["--awq_block_size", str(config.quantization.group_size)]
    return Step(
        "quantize",
        "quantize.py",
        argv,
        [f"{out}/config.json", f"{out}/rank*.safetensors"],
        f"ModelOpt {choice.qformat} quantization with local calibration data",
        env=dict(OFFLINE_ENV),
    )


def _converter_argv(script: str, model_dir: str, out: str, dtype: str, par: ParallelConfig, *model_flags: str) -> list[str]:
    """The flags every convert_checkpoint.py (one per family, EAGLE's) takes; `model_flags` name further model inputs."""
    return [
        PYTHON,
        script,
        "--model_dir",
        model_dir,
        *model_flags,
        "--output_dir",
        out,
        "--dtype",
        dtype,
        "--tp_size",
        str(par.tp),
        "--pp_size",
        str(par.pp),
    ]


def _converter_step(name: str, tool: str, argv: list[str], choice: QuantChoice | None, par: ParallelConfig, out: str, what: str) -> Step:
    """`argv` plus the weight-only and worker flags every converter takes, as a step writing a checkpoint to `out`."""
    if choice and choice.algorithm in CONVERT_WEIGHT_ONLY:
        argv = [*argv, "--use_weight_only", "--weight_only_precision", CONVERT_WEIGHT_ONLY[choice.algorithm]]
    if par.world_size > 1:
        argv = [*argv, "--workers", str(min(par.world_size, 8))]
    return Step(name, tool, argv, [f"{out}/config.json", f"{out}/rank*.safetensors"], what, env=dict(OFFLINE_ENV))


def _convert_step(
    config: ForgeConfig, family: str, choice: QuantChoice | None, model_dir: str, dtype: str, out: str, spec: Spec, name: str = "convert"
) -> Step:
    par = config.parallel
    argv = _converter_argv(_script(spec, family), model_dir, out, dtype, par)
    if par.moe_tp is not None:
        argv += ["--moe_tp_size", str(par.moe_tp)]
    if par.moe_ep is not None:
        argv += ["--moe_ep_size", str(par.moe_ep)]
    tool = "qwen/convert_checkpoint.py" if family == "qwen2" else "convert_checkpoint.py"
    return _converter_step(
        name, tool, argv, choice, par, out, f"convert the Hugging Face checkpoint ({family}) to a TensorRT-LLM checkpoint"
    )


def _eagle_step(config: ForgeConfig, choice: QuantChoice, model_dir: str, dtype: str, out: str, spec: Spec) -> Step:
    par, sp = config.parallel, config.engine.speculative
    assert sp.draft_model is not None  # config/checks.py requires it for this mode
    argv = _converter_argv(
        _script(spec, "eagle"), model_dir, out, dtype, par, "--eagle_model_dir", str(config.resolve_path(sp.draft_model))
    )
    argv += [
        "--max_draft_len",
        str(sp.max_draft_len),
        "--num_eagle_layers",
        str(EAGLE_NUM_LAYERS),
        "--max_non_leaves_per_layer",
        str(EAGLE_MAX_NON_LEAVES),
    ]
    what = "convert the base model and the EAGLE heads into one TensorRT-LLM checkpoint"
    return _converter_step("convert", "eagle/convert_checkpoint.py", argv, choice, par, out, what)


def _build_argv(config: ForgeConfig, spec: Spec, checkpoint: str, out: str, flags: dict[str, str], draft_engine: bool = False) -> list[str]:
    eng, sp = config.engine, config.engine.speculative
    argv = [
        "trtllm-build",
        "--checkpoint_dir",
        checkpoint,
        "--output_dir",
        out,
        "--max_batch_size",
        str(eng.max_batch_size),
        "--max_input_len",
        str(eng.max_input_len),
        "--max_seq_len",
        str(eng.max_seq_len),
        "--max_num_tokens",
        str(eng.resolved_max_num_tokens),
        "--max_beam_width",
        str(eng.max_beam_width),
        "--kv_cache_type",
        plain(eng.kv_cache_type),
        "--tokens_per_block",
        str(eng.tokens_per_block),
        "--workers",
        str(build_gpus(config)),
        "--output_timing_cache",
        "model.cache",
        "--log_level",
        "info",
    ]
    for flag, value in flags.items():
        argv += [flag, value]
    if not draft_engine:
        mode = spec.speculative_build_modes.get(plain(sp.mode))
        if mode:
            argv += ["--speculative_decoding_mode", mode, "--max_draft_len", str(sp.max_draft_len)]
        if eng.gather_logits.context:
            argv.append("--gather_context_logits")
        if eng.lora.enabled:
            argv += ["--max_lora_rank", str(eng.lora.max_rank), "--lora_target_modules", *eng.lora.target_modules]
    if eng.gather_logits.generation:
        argv.append("--gather_generation_logits")
    return argv


def _flag_map(argv: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    key = None
    for arg in argv[1:]:
        if arg.startswith("--"):
            key = arg
            out[key] = ""
        elif key is not None:
            out[key] = f"{out[key]} {arg}".strip()
    return out


def _check_steps(steps: list[Step], spec: Spec, warnings: list[PlanWarning]) -> None:
    """Every generated argv must parse with the parser built from the spec table of its tool."""
    for step in steps:
        if step.tool not in TOOL_TABLES:
            continue
        args = step.argv[1:] if step.tool == "trtllm-build" else step.argv[2:]
        parsed = spec.parser(step.tool).parse(args)
        table = spec.flags(step.tool)
        for flag in parsed.deprecated_used:
            replacement = table[flag].replacement
            warnings.append(
                PlanWarning(
                    "deprecated_flag",
                    step.name,
                    f"{flag} is deprecated in TensorRT-LLM {spec.version}" + (f" (use {replacement})" if replacement else ""),
                )
            )
    warnings.extend(uncertain_facts(steps, spec))


def uncertain_facts(steps: list[Step], spec: Spec) -> list[PlanWarning]:
    """The facts the generated commands were checked against that are not tied to TensorRT-LLM 1.2.1: one warning
    per uncertain source (naming the steps that rely on it) and one per step for rows uncertain themselves."""
    by_source: dict[str, list[str]] = {}
    out = []
    for step in steps:
        if step.tool not in TOOL_TABLES:
            continue
        table = spec.flags(step.tool)
        used = [a for a in step.argv if a.startswith("--") and a in table]
        for key in dict.fromkeys(table[flag].source for flag in used):
            by_source.setdefault(key, []).append(step.name)
        rows = [flag for flag in used if table[flag].uncertain]
        if rows:
            out.append(
                PlanWarning("uncertain_flag", step.name, f"{', '.join(rows)}: values or choices not tied to TensorRT-LLM {spec.version}")
            )
    for key, names in by_source.items():
        source = spec.source(key)
        if source.uncertain:
            out.insert(
                0,
                PlanWarning(
                    "uncertain_source",
                    ", ".join(names),
                    f"checked against {source.cite()}, not tied to TensorRT-LLM {spec.version} (its commit is not pinned)",
                ),
            )
    return out


def plan_build(config: ForgeConfig, checkpoint_dir: Path | None = None, workdir: Path | None = None) -> BuildPlan:
    """The complete, spec-checked plan. Raises ConfigError(s) for anything the 1.2.x builder would refuse.
    `workdir` places the LLM-API path's quantized checkpoint (an absolute path in it)."""
    if config.engine.backend != "tensorrt-llm":
        raise ConfigError("engine.backend", f"{config.engine.backend} is not built by the TensorRT-LLM builder", "use tensorrt-llm")
    spec = load_spec(config.engine.trtllm_version)
    if config.engine.target == "llmapi":
        return plan_llmapi(config, checkpoint_dir, spec, workdir)
    device = find_device(config.hardware.gpu)
    if device is None or device.compute_capability is None:
        raise ConfigError("hardware.gpu", f"{config.hardware.gpu!r} is not a GPU of the hardware table", "e.g. H100-SXM, L40S, A10G")
    sm = sm_of(device.compute_capability)
    shape = shape_for(config)
    family = _family(config, shape, device, spec)
    architecture = spec.architectures[family]
    model_dir = model_source(config, checkpoint_dir)
    dtype = resolve_model_dtype(config, model_dir)
    choice = choose(config.quantization.algorithm, config.quantization.kv_cache, spec)
    sp = config.engine.speculative
    warnings: list[PlanWarning] = []

    if sp.mode == "eagle":
        choice = _eagle_choice(config, choice, dtype, warnings)

    flags = plugin_flags(config, is_moe=bool(shape and shape.is_moe))
    if plain(sp.mode) == "prompt_lookup":
        _prompt_lookup_rules(config, spec, flags, warnings)
    problems = capability_problems(choice, sm, device.name, spec, flags)
    if problems:
        raise ConfigErrors(problems)
    effective, adjust_warnings = effective_build(config, shape, sm, architecture, choice, flags, spec)
    warnings += adjust_warnings

    plugins = custom_plugins(config)
    steps: list[Step] = []
    files: dict[str, str] = {}
    for plugin in plugins:
        if plugin.kind == "source":
            name = Path(plugin.library).parent.parent.name
            build_dir = f"plugins/{name}/cmake-build"
            steps.append(
                Step(
                    f"plugin-{name}-configure",
                    "cmake",
                    ["cmake", "-S", plugin.path, "-B", build_dir, "-DCMAKE_BUILD_TYPE=Release", f"-DPLUGIN_NAME={name}"],
                    [build_dir],
                    f"configure the custom TensorRT plugin {name} (its CMake recipe)",
                )
            )
            steps.append(
                Step(
                    f"plugin-{name}-build",
                    "cmake",
                    ["cmake", "--build", build_dir, "-j", "2"],
                    [plugin.library],
                    f"compile the custom TensorRT plugin {name}",
                )
            )
        files[plugin.library] = "custom TensorRT plugin library (LD_PRELOAD in build and serving)"
        if plugin.sha256 is None and plugin.kind == "library":
            warnings.append(
                PlanWarning(
                    "custom_plugin_not_here",
                    "engine.plugins.custom_libraries",
                    f"{plugin.path} is not on this machine; its sha256 is recorded when the build runs",
                )
            )

    calib_step, calib_source = _calibration_step(config, choice, warnings)
    if calib_step:
        steps.append(calib_step)
        files[f"{CALIBRATION_DIR}/train.jsonl"] = "local calibration samples"
    ckpt = "checkpoint"
    if sp.mode == "eagle":
        steps.append(_eagle_step(config, choice, str(model_dir), dtype, ckpt, spec))
    elif choice.tool == "quantize.py":
        steps.append(_quantize_step(config, choice, str(model_dir), dtype, ckpt, spec, warnings))
    else:
        steps.append(_convert_step(config, family, choice, str(model_dir), dtype, ckpt, spec))
    files[f"{ckpt}/config.json"] = "TensorRT-LLM checkpoint config"
    for rank in range(config.parallel.world_size):
        files[f"{ckpt}/rank{rank}.safetensors"] = f"checkpoint weights, rank {rank}"

    build_argv = _build_argv(config, spec, ckpt, "engine", flags)
    build_env = {"LD_PRELOAD": preload_value(plugins)} if plugins else {}
    steps.append(
        Step(
            "build", "trtllm-build", build_argv, ["engine/config.json", "engine/rank*.engine"], "build the TensorRT engines", env=build_env
        )
    )
    files["engine/config.json"] = "engine config (version, pretrained_config, build_config)"
    for rank in range(config.parallel.world_size):
        files[f"engine/rank{rank}.engine"] = f"serialized TensorRT engine, rank {rank}"
    files["model.cache"] = "TensorRT timing cache (speeds up rebuilds)"

    draft = None
    if sp.mode == "draft_target":
        assert sp.draft_model is not None  # config/checks.py requires it for this mode
        draft_dir = str(config.resolve_path(sp.draft_model))
        # The draft model is converted unquantized: its plugins follow its own dtype, not the FP8 target's.
        draft_flags = draft_plugin_flags(config, is_moe=False)
        draft_flags["--use_paged_context_fmha"] = "enable"
        steps.append(_convert_step(config, family, None, draft_dir, dtype, "draft/checkpoint", spec, name="convert-draft"))
        steps.append(
            Step(
                "build-draft",
                "trtllm-build",
                _build_argv(config, spec, "draft/checkpoint", DRAFT_ENGINE_DIR, draft_flags, True),
                [f"{DRAFT_ENGINE_DIR}/config.json"],
                "build the draft model's engines",
                env=build_env,
            )
        )
        files[f"{DRAFT_ENGINE_DIR}/config.json"] = "draft engine config"
        draft = {"model_dir": draft_dir, "engine_dir": DRAFT_ENGINE_DIR, "max_draft_len": sp.max_draft_len}

    _check_steps(steps, spec, warnings)
    warnings += serving_route_warnings(spec) + multi_node_build_notes(config)
    requested = {
        "max_batch_size": config.engine.max_batch_size,
        "max_input_len": config.engine.max_input_len,
        "max_seq_len": config.engine.max_seq_len,
        "max_num_tokens": config.engine.resolved_max_num_tokens,
        "max_beam_width": config.engine.max_beam_width,
        "tokens_per_block": config.engine.tokens_per_block,
    }
    plan = BuildPlan(
        config_name=config.name or "default",
        target="engine",
        trtllm_version=spec.version,
        container_image=spec.container_image,
        gpu=device.name,
        sm=sm,
        architecture=architecture,
        dtype=dtype,
        model_dir=str(model_dir),
        tp=config.parallel.tp,
        pp=config.parallel.pp,
        quant=choice,
        steps=steps,
        files=files,
        warnings=warnings,
        effective=effective,
        requested=requested,
        build_flags=_flag_map(build_argv),
        custom_plugins=plugins,
        calibration_source=calib_source,
        llmapi={},
        shape=shape,
        draft=draft,
    )
    plan.llmapi = llmapi.engine_equivalent(config, plan)
    return plan


def _prompt_lookup_rules(config: ForgeConfig, spec: Spec, flags: dict[str, str], warnings: list[PlanWarning]) -> None:
    """What NVIDIA's n-gram (prompt lookup) engine workflow needs beyond the build mode (spec speculative_build_modes)."""
    needs = spec.data["speculative_build_modes"]["prompt_lookup"]
    if config.engine.max_beam_width > needs["max_beam_width"]:
        raise ConfigError(
            "engine.max_beam_width",
            f"prompt lookup on the engine target supports beam width 1 (got {config.engine.max_beam_width})",
            "set engine.max_beam_width: 1",
        )
    if flags.get("--use_paged_context_fmha") != needs["use_paged_context_fmha"]:
        warnings.append(
            PlanWarning(
                "prompt_lookup_forces_paged_context_fmha",
                "engine.plugins.paged_context_fmha",
                "prompt lookup reuses KV-cache blocks, which needs paged context FMHA: built with it on",
            )
        )
        flags["--use_paged_context_fmha"] = needs["use_paged_context_fmha"]
    if needs["needs_kv_cache_reuse"] and not config.runtime.enable_kv_cache_reuse:
        warnings.append(
            PlanWarning(
                "prompt_lookup_needs_kv_reuse",
                "runtime.enable_kv_cache_reuse",
                "NVIDIA's n-gram workflow runs with KV-cache block reuse; set runtime.enable_kv_cache_reuse: true",
            )
        )


def _eagle_choice(config: ForgeConfig, choice: QuantChoice, dtype: str, warnings: list[PlanWarning]) -> QuantChoice:
    """What NVIDIA's EAGLE converter builds (its limits are rules.py's): weight-only or no quantization, no KV quantization."""
    if config.quantization.kv_cache != "none":
        warnings.append(
            PlanWarning(
                "eagle_kv_quantization_dropped",
                "quantization.kv_cache",
                f"{config.quantization.kv_cache} KV cache is not baked into the EAGLE checkpoint (its converter "
                f"only offers --int8_kv_cache, which needs calibration); the KV cache stays {dtype}",
            )
        )
    return QuantChoice(choice.algorithm, "none", choice.quant_algo, None, "eagle/convert_checkpoint.py", None, False)


def multi_node_build_notes(config: ForgeConfig) -> list[PlanWarning]:
    """A multi-node engine is built on one node: say so, and where its ranks must be for serving."""
    par = config.parallel
    if par.world_size <= par.gpus_per_node:
        return []
    return [
        PlanWarning(
            "multi_node_build_on_one_node",
            "parallel.nodes",
            f"the {par.world_size} rank engines are built on one node of {par.gpus_per_node} GPUs (trtllm-build --workers "
            f"{build_gpus(config)}, one rank per GPU at a time); every one of the {par.nodes} serving nodes reads them "
            "from the same storage (deploy.kubernetes.storage: pvc)",
        )
    ]


def serving_route_warnings(spec: Spec) -> list[PlanWarning]:
    """The serving image is a route of ours, not an image NVIDIA ships: say so, with what was not tried."""
    route = images.image_for_version(spec.version)
    if route.how != "pinned-install":
        return []
    assert route.base_image is not None  # a pinned-install route names the image it installs into
    base = images.describe_image(route.base_image)
    return [
        PlanWarning(
            "uncertain_source",
            "serving image",
            f"no NGC Triton image ships TensorRT-LLM {spec.version}: built and served in {route.image} (docker/Dockerfile on "
            f"{route.base_image}, whose tensorrtllm backend was built for TensorRT-LLM {base.tensorrt_llm if base else 'another version'}; "
            "not yet tried on a GPU)",
        )
    ]


def fact_warnings(config: ForgeConfig) -> list[PlanWarning]:
    """For `trtllm-forge plan`: the warnings of the build plan about facts not tied to TensorRT-LLM 1.2.1
    (empty when there is no engine to build, or when the build plan itself is refused: build-engine says why); on
    the LLM-API path, that model.source is already quantized (a quantization.algorithm that differs: ConfigError)."""
    if config.engine.backend != "tensorrt-llm":
        return []
    if config.engine.target == "llmapi":
        source = config.resolve_path(config.model.source)
        prequantized = read_prequantized(source) if source.is_dir() else None
        if prequantized is None:
            return []
        check_declared(prequantized, config.quantization.algorithm)
        return [_prequantized_warning(prequantized)]
    if config.engine.target != "engine":
        return []
    try:
        plan = plan_build(config)
    except ConfigError:
        return []
    return [w for w in plan.warnings if w.code.startswith("uncertain_")]


LLMAPI_DIR = "llmapi"


def _prequantized_warning(prequantized: PreQuantized) -> PlanWarning:
    return PlanWarning(
        "prequantized_checkpoint",
        "model.source",
        f"{prequantized.describe()}: the LLM API loads it as it is, no quantization step ({prequantized.file})",
    )


def plan_llmapi(config: ForgeConfig, checkpoint_dir: Path | None, spec: Spec, workdir: Path | None = None) -> BuildPlan:
    """engine.target llmapi: no engine; the PyTorch-backend files and the trtllm-serve command, after ModelOpt's
    quantization to a Hugging Face checkpoint when the config quantizes a checkpoint that is not already quantized."""
    device = find_device(config.hardware.gpu)
    if device is None or device.compute_capability is None:
        raise ConfigError("hardware.gpu", f"{config.hardware.gpu!r} is not a GPU of the hardware table", "e.g. H100-SXM, L40S, A10G")
    shape = shape_for(config)
    _family(config, shape, device, spec)
    model_dir = model_source(config, checkpoint_dir)
    warnings: list[PlanWarning] = []
    for field_name, why in llmapi.dropped_field_problems(config):
        warnings.append(PlanWarning("llmapi_unused_field", field_name, f"{field_name} is not used on the LLM-API path: {why}"))
    if config.engine.plugins.custom_libraries:
        warnings.append(
            PlanWarning(
                "custom_plugins_pytorch",
                "engine.plugins.custom_libraries",
                "the PyTorch backend builds no TensorRT network: custom TensorRT plugins are only preloaded",
            )
        )
    version = llmapi.version_table(config).version
    release = images.release_image(version)
    prequantized = read_prequantized(model_dir) if model_dir.is_dir() else None
    quantize = None
    if prequantized is not None:
        check_declared(prequantized, config.quantization.algorithm)
        warnings.append(_prequantized_warning(prequantized))
    elif config.quantization.algorithm != "none":
        if workdir is None:
            raise ValueError("the LLM-API plan of a quantized config needs the workdir: its export is an absolute path there")
        quantize = modelopt.plan_quantize(config, str(model_dir), workdir, version)
    served_model = str(quantize.export_dir) if quantize else str(model_dir)
    options = llmapi.llm_api_options(config)
    yaml_body = llmapi.model_yaml(config, served_model)
    options_file = f"{LLMAPI_DIR}/extra_llm_api_options.yaml"
    serve = llmapi.serve_argv(config, served_model, options_file)
    steps = []
    quantize_doc: dict | None = None
    if quantize:
        warnings.append(
            PlanWarning(
                "pytorch_modelopt_quantization",
                "quantization.algorithm",
                f"the PyTorch backend does not quantize at load time: {config.quantization.algorithm} (KV {quantize.kv_qformat}) is "
                f"ModelOpt's quantization to a Hugging Face checkpoint at {quantize.export_dir}, run on a GPU in {quantize.image} "
                f"(nvidia-modelopt{quantize.modelopt}); the LLM API loads that checkpoint. A pre-quantized model.source skips it",
            )
        )
        warnings += [PlanWarning("modelopt_unused_field", name, why) for name, why in quantize.notes]
        steps += [
            Step(
                "modelopt-fetch",
                "git",
                quantize.fetch_argv,
                [str(quantize.examples_dir)],
                f"ModelOpt {modelopt.MODELOPT_TAG}'s examples (hf_ptq.py is not in the release image), beside the export",
            ),
            Step(
                "modelopt-quantize",
                "hf_ptq.py",
                quantize.quantize_argv,
                [str(quantize.export_dir)],
                f"ModelOpt post-training quantization ({config.quantization.algorithm}) to a Hugging Face checkpoint, "
                f"in {quantize.image} on a GPU",
            ),
        ]
        quantize_doc = {
            "image": quantize.image,
            "modelopt": quantize.modelopt,
            "export_dir": str(quantize.export_dir),
            "examples_dir": str(quantize.examples_dir),
            "docker_run": quantize.docker_argv(str(model_dir), build_gpus(config)),
        }
    steps += [
        Step(
            "write-model-yaml",
            "internal",
            ["trtllm-forge:write-yaml", f"{LLMAPI_DIR}/model.yaml"],
            [f"{LLMAPI_DIR}/model.yaml"],
            "the Triton llmapi model's model.yaml (LLM() arguments + triton_config)",
        ),
        Step(
            "write-llm-api-options",
            "internal",
            ["trtllm-forge:write-yaml", options_file],
            [options_file],
            "--extra_llm_api_options for trtllm-serve / trtllm-bench",
        ),
    ]
    files = {
        f"{LLMAPI_DIR}/model.yaml": "Triton llmapi model.yaml",
        options_file: "extra LLM-API options",
        f"{LLMAPI_DIR}/serve.json": "the trtllm-serve argv (run it in the container)",
    }
    plugins = custom_plugins(config)
    choice = choose(config.quantization.algorithm, config.quantization.kv_cache, spec)
    return BuildPlan(
        config_name=config.name or "default",
        target="llmapi",
        trtllm_version=spec.version,
        container_image=release.image,
        gpu=device.name,
        sm=sm_of(device.compute_capability),
        architecture=spec.architectures[family_of(config, shape) or "llama"],
        dtype=resolve_model_dtype(config, model_dir),
        model_dir=str(model_dir),
        tp=config.parallel.tp,
        pp=config.parallel.pp,
        quant=choice,
        steps=steps,
        files=files,
        warnings=warnings,
        effective=None,
        requested={},
        build_flags={},
        custom_plugins=plugins,
        calibration_source=None,
        llmapi={
            "model_yaml": yaml_body,
            "extra_llm_api_options": options,
            "serve_argv": serve,
            "quantize": quantize_doc,
            "prequantized": None
            if prequantized is None
            else {"file": str(prequantized.file), "field": prequantized.field, "quant_algo": prequantized.quant_algo},
        },
        shape=shape,
    )
