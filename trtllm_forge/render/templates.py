"""Write a model repository from the templates in model_repo_templates/ (Jinja2, StrictUndefined)."""

from __future__ import annotations

import importlib.resources
import shutil
from pathlib import Path

import jinja2

from trtllm_forge.builders.engines import CPU_ADAPTERS
from trtllm_forge.errors import StepError
from trtllm_forge.render.values import RepositoryValues, triton_dtype

# (role, template directory, python files copied into <model>/1/ from python_models/)
ENGINE_KIND_MODELS = (
    ("ensemble", "ensemble", ()),
    ("preprocessing", "preprocessing", ("preprocessing/model.py", "tokenizer_loading.py", "request_checks.py")),
    ("tensorrt_llm", "tensorrt_llm", ()),
    ("postprocessing", "postprocessing", ("postprocessing/model.py", "forge_detokenize.py", "tokenizer_loading.py")),
    ("bls", "tensorrt_llm_bls", ("tensorrt_llm_bls/model.py", "forge_detokenize.py", "tokenizer_loading.py", "request_checks.py")),
)
CPU_ENGINE_MODEL = Path("cpu") / "tensorrt_llm" / "model.py"
# Siblings the CPU engine model imports, copied with it: the adapter protocol, every CPU engine's served adapter (the
# one an engine's config.json names is loaded), and the settings and KV pool helpers the adapters share.
CPU_ENGINE_SIBLINGS = (
    "engine_adapter.py",
    "engine_loop.py",
    *(f"{adapter}.py" for adapter in CPU_ADAPTERS),
    "genai_settings.py",
    "kv_pool.py",
)
REQUEST_CHECKS = "request_checks.py"  # python_models/request_checks.py, also next to the CPU engine model
EMPTY_VERSION_MARKER = ".gitkeep"


def templates_root() -> Path:
    return Path(str(importlib.resources.files("trtllm_forge.model_repo_templates")))


def pb_string(value: object) -> str:
    """A protobuf text-format string literal (UTF-8 kept as is; only backslash, quote and newlines escaped)."""
    text = str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r")
    return f'"{text}"'


def pb_bool(value: object) -> str:
    if not isinstance(value, bool):
        raise TypeError(f"expected a bool, got {value!r}")
    return "true" if value else "false"


def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_root())),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )
    env.filters["pbstr"] = pb_string
    env.filters["pbbool"] = pb_bool
    return env


def render_template(name: str, context: dict) -> str:
    try:
        return environment().get_template(name).render(**context)
    except jinja2.UndefinedError as exc:
        raise StepError("render", f"template {name} uses an undefined value ({exc.message})", "this is a bug in trtllm-forge") from None


def _copy(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target)


def write_engine_repository(values: RepositoryValues, out: Path) -> list[Path]:
    """The five models (ensemble, preprocessing, engine model, postprocessing, BLS) into `out`."""
    root = templates_root()
    cpu_model = root / CPU_ENGINE_MODEL
    context = values.template_context()
    written: list[Path] = []
    for role, template_dir, python_files in ENGINE_KIND_MODELS:
        model_dir = out / values.names[role]
        version_dir = model_dir / "1"
        version_dir.mkdir(parents=True, exist_ok=True)
        config = model_dir / "config.pbtxt"
        config.write_text(render_template(f"inflight_batcher_llm/{template_dir}/config.pbtxt.j2", context))
        written.append(config)
        for relative in python_files:
            target = version_dir / Path(relative).name
            _copy(root / "python_models" / relative, target)
            written.append(target)
        if role == "tensorrt_llm" and values.kind == "cpu":
            _copy(cpu_model, version_dir / "model.py")
            _copy(root / "python_models" / REQUEST_CHECKS, version_dir / REQUEST_CHECKS)
            written += [version_dir / "model.py", version_dir / REQUEST_CHECKS]
            for sibling in CPU_ENGINE_SIBLINGS:
                _copy(cpu_model.parent / sibling, version_dir / sibling)
                written.append(version_dir / sibling)
        if not any(version_dir.iterdir()):
            (version_dir / EMPTY_VERSION_MARKER).write_text("")
            written.append(version_dir / EMPTY_VERSION_MARKER)
    if values.draft is not None:
        written += write_draft_model(values, out)
    return written


def write_draft_model(values: RepositoryValues, out: Path) -> list[Path]:
    """tensorrt_llm_draft: the engine model's config with the draft's name, engine and KV values, not decoupled
    (NVIDIA copies tensorrt_llm's config and fills it with decoupled_mode:False; render/draft.py)."""
    draft = values.draft
    assert draft is not None
    context = {
        **values.template_context(),
        "names": {**values.names, "tensorrt_llm": draft.name},
        "decoupled": False,
        "tensorrt_llm_parameters": draft.parameters,
        "logits_datatype": triton_dtype(draft.logits_datatype_of, f"{draft.engine_dir}/config.json pretrained_config.logits_dtype"),
        "encoder_input_features_data_type": triton_dtype(draft.dtype_of, f"{draft.engine_dir}/config.json pretrained_config.dtype"),
        "engine_model_description": f"draft model of draft-target decoding, {values.engine_model_description}",
    }
    version_dir = out / draft.name / "1"
    version_dir.mkdir(parents=True, exist_ok=True)
    (version_dir / EMPTY_VERSION_MARKER).write_text("")
    config = out / draft.name / "config.pbtxt"
    config.write_text(render_template("inflight_batcher_llm/tensorrt_llm/config.pbtxt.j2", context))
    return [config, version_dir / EMPTY_VERSION_MARKER]
