"""The engine-less repository kinds: `llmapi` (TensorRT-LLM PyTorch backend via the LLM API) and `vllm`
(Triton's vLLM backend), both serving the checkpoint directly."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from trtllm_forge.config.schema import BUILTIN_MODELS, ForgeConfig
from trtllm_forge.errors import ConfigError
from trtllm_forge.importer.stage import imported_checkpoint
from trtllm_forge.render.stub_env import project_env
from trtllm_forge.render.templates import render_template, templates_root
from trtllm_forge.stage_results import BuildResult


def checkpoint_for(config: ForgeConfig, workdir: Path) -> tuple[str, list[str]]:
    """What the serving engine should load: the imported checkpoint, a local HF directory, or the model id."""
    imported = imported_checkpoint(workdir)
    if imported is not None and (imported / "config.json").is_file():
        return str(imported.resolve()), []
    source = config.resolve_path(config.model.source)
    if source.is_dir():
        return str(source.resolve()), []
    if config.model.source not in BUILTIN_MODELS and source.suffix != ".gguf":
        # A Hugging Face directory on the serving host (e.g. /models/...), not necessarily on this machine.
        return str(source), [f"{source} is not on this machine; the serving host must have it"]
    if imported is None:
        raise ConfigError(
            "model.source", f"{source} needs importing and {workdir} holds no imported checkpoint", "run `trtllm-forge import` first"
        )
    warning = f"no imported checkpoint at {imported}; the repository points at it (run `trtllm-forge import` first)"
    return str(imported.resolve()), [warning]


def _python_env(config: ForgeConfig) -> str | None:
    return str(project_env()) if config.deploy.target == "local" else None


STAND_IN_SHIM = "llmapi_cpu_shim"


def write_llmapi_repository(config: ForgeConfig, workdir: Path, out: Path, engine_dir: Path | None = None) -> tuple[list[Path], list[str]]:
    """NVIDIA's llmapi layout: tensorrt_llm/{config.pbtxt, 1/model.py, 1/model.yaml}. For engine.backend openvino
    the model loads the OpenVINO IR in `engine_dir`, and a `tensorrt_llm` shim package beside model.py points
    `import tensorrt_llm` at trtllm-forge's CPU stand-in (model.py itself is the same file as on GPU)."""
    from trtllm_forge.builders.tensorrt_llm.llmapi import write_model_yaml

    stand_in = config.engine.backend == "openvino"
    if stand_in:
        if engine_dir is None:
            raise ConfigError(
                "--engine-dir",
                "the CPU llmapi repository serves the OpenVINO IR of the build stage, and there is none",
                "run `trtllm-forge build-engine CONFIG` first or pass --engine-dir DIR",
            )
        model, warnings = str(Path(engine_dir).resolve()), list[str]()
    else:
        built = BuildResult.in_workdir(workdir)
        if built is not None and built.quantized_checkpoint is not None:
            model, warnings = str(built.quantized_checkpoint), []  # ModelOpt's export (builders/tensorrt_llm/modelopt.py)
        else:
            model, warnings = checkpoint_for(config, workdir)
    name = config.triton.model_names.tensorrt_llm
    version = out / name / "1"
    version.mkdir(parents=True, exist_ok=True)
    context = {
        "name": name,
        "max_batch_size": 0,
        "decoupled": config.triton.decoupled,
        "instance_count": config.triton.instances.tensorrt_llm,
        "parameters": {"EXECUTION_ENV_PATH": _python_env(config)},
    }
    config_path = out / name / "config.pbtxt"
    config_path.write_text(render_template("llmapi/tensorrt_llm/config.pbtxt.j2", context))
    files = [config_path, write_model_yaml(config, version, model)]
    shutil.copyfile(templates_root() / "llmapi" / "tensorrt_llm" / "model.py", version / "model.py")
    files.append(version / "model.py")
    if stand_in:
        shim = templates_root() / STAND_IN_SHIM / "tensorrt_llm"
        for source in sorted(shim.rglob("*.py")):
            target = version / "tensorrt_llm" / source.relative_to(shim)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)
            files.append(target)
        warnings.append(
            "CPU rendering: `tensorrt_llm` in this repository is trtllm-forge's CPU stand-in (OpenVINO GenAI), not TensorRT-LLM"
        )
    return files, warnings


def vllm_engine_args(config: ForgeConfig, model: str) -> dict:
    eng, rt = config.engine, config.runtime
    args = {
        "model": model,
        "disable_log_requests": True,
        "gpu_memory_utilization": rt.kv_cache_free_gpu_mem_fraction,
        "tensor_parallel_size": config.parallel.tp,
        "pipeline_parallel_size": config.parallel.pp,
        "max_model_len": eng.max_seq_len,
        "max_num_seqs": eng.max_batch_size,
        "max_num_batched_tokens": eng.resolved_max_num_tokens,
        "enable_prefix_caching": rt.enable_kv_cache_reuse,
        "enable_chunked_prefill": rt.enable_chunked_context,
        "block_size": eng.tokens_per_block,
        "trust_remote_code": config.model.trust_remote_code,
    }
    if config.model.dtype != "auto":
        args["dtype"] = config.model.dtype
    if config.quantization.kv_cache == "fp8":
        args["kv_cache_dtype"] = "fp8"
    return args


def write_vllm_repository(config: ForgeConfig, workdir: Path, out: Path) -> tuple[list[Path], list[str]]:
    model, warnings = checkpoint_for(config, workdir)
    name = "vllm_model"
    version = out / name / "1"
    version.mkdir(parents=True, exist_ok=True)
    config_path = out / name / "config.pbtxt"
    config_path.write_text(render_template("vllm/model/config.pbtxt.j2", {"name": name, "decoupled": config.triton.decoupled}))
    (version / "model.json").write_text(json.dumps(vllm_engine_args(config, model), indent=2) + "\n")
    return [config_path, version / "model.json"], [
        *warnings,
        "the vllm kind needs Triton's vLLM backend (e.g. the nvcr.io/nvidia/tritonserver:<yy.mm>-vllm-python-py3 image)",
    ]
