"""Read a YAML config file into a validated ForgeConfig, reporting every problem as one line."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from trtllm_forge.config.schema import ForgeConfig
from trtllm_forge.errors import ConfigError, ConfigErrors


def _read_yaml(path: Path) -> dict:
    if not path.is_file():
        raise ConfigError(str(path), "config file not found", "pass the path of an existing YAML file")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(where, f"invalid YAML ({problem})", "fix the syntax at that line") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(str(path), f"top level is a {type(data).__name__}", "it must be a mapping of sections")
    return data


def _model_at(loc: tuple, root: type[BaseModel]) -> type[BaseModel] | None:
    """The pydantic model class that holds the field at `loc` (for did-you-mean suggestions)."""
    model: Any = root
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        field = getattr(model, "model_fields", {}).get(part)
        if field is None:
            return None
        annotation = field.annotation
        candidates = [annotation, *getattr(annotation, "__args__", ())]
        model = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
        if model is None:
            return None
    return model


def _dotted(loc: tuple) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def _explain(error: dict) -> ConfigError:
    loc = tuple(error["loc"])
    where = _dotted(loc)
    kind = error["type"]
    if kind == "extra_forbidden":
        owner = _model_at(loc, ForgeConfig)
        valid_keys = [k for k in (owner.model_fields if owner else {}) if k != "config_dir"]
        close = difflib.get_close_matches(str(loc[-1]), valid_keys, n=1, cutoff=0.6)
        hint = f"did you mean '{close[0]}'?" if close else f"valid keys: {', '.join(valid_keys)}"
        return ConfigError(where, "unknown key", hint)
    if kind == "missing":
        return ConfigError(where, "required field is missing", "add it (see `trtllm-forge config schema`)")
    if kind in ("literal_error", "enum"):
        expected = error.get("ctx", {}).get("expected", "")
        return ConfigError(where, f"invalid value {error.get('input')!r}", f"expected one of {expected}")
    message = error["msg"].removeprefix("Value error, ")
    return ConfigError(where, f"{message} (got {error.get('input')!r})", "see `trtllm-forge config schema`")


def parse_config(data: dict, config_dir: Path | None = None, name: str | None = None) -> ForgeConfig:
    """Validate a mapping (already read from YAML) and run the cross-field checks."""
    from trtllm_forge.config.checks import check_config

    try:
        config = ForgeConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigErrors([_explain(e) for e in exc.errors()]) from None
    config.config_dir = config_dir
    if config.name is None and name:
        config.name = name
    problems = check_config(config)
    if problems:
        raise ConfigErrors(problems)
    return config


def load_config(path: str | Path) -> ForgeConfig:
    path = Path(path)
    data = _read_yaml(path)
    return parse_config(data, config_dir=path.resolve().parent, name=path.stem)
