"""Read a YAML config file into a validated ForgeConfig, reporting every problem as one line."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from trtllm_forge.config.names import NAME_RULE, binds_every_interface
from trtllm_forge.config.schema import ForgeConfig
from trtllm_forge.config.yaml_reader import read_yaml_document, shorten
from trtllm_forge.errors import ConfigError, ConfigErrors

MAX_ERRORS_SHOWN = 20


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


def _explain(error: ErrorDetails) -> ConfigError:
    loc = tuple(error["loc"])
    where = _dotted(loc)
    kind = error["type"]
    if kind == "extra_forbidden":
        owner = _model_at(loc, ForgeConfig)
        valid_keys = [k for k in (owner.model_fields if owner else {}) if k not in ("config_dir", "config_file")]
        close = difflib.get_close_matches(str(loc[-1]), valid_keys, n=1, cutoff=0.6)
        hint = f"did you mean '{close[0]}'?" if close else f"valid keys: {', '.join(valid_keys)}"
        return ConfigError(where, "unknown key", hint)
    if kind == "missing":
        return ConfigError(where, "required field is missing", "add it (see `trtllm-forge config schema`)")
    if kind in ("literal_error", "enum"):
        expected = error.get("ctx", {}).get("expected", "")
        return ConfigError(where, f"invalid value {shorten(error.get('input'))}", f"expected one of {expected}")
    message = error["msg"].removeprefix("Value error, ")
    problem, _, valid = message.partition("; ")  # our validators say "<problem>; <what would be valid>"
    return ConfigError(where, f"{problem} (got {shorten(error.get('input'))})", valid or "see `trtllm-forge config schema`")


def parse_config(data: dict, config_dir: Path | None = None, name: str | None = None) -> ForgeConfig:
    """Validate a mapping (already read from YAML) and run the cross-field checks."""
    from trtllm_forge.config.checks import check_config

    try:
        config = ForgeConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigErrors(_capped([_explain(e) for e in exc.errors()])) from None
    config.config_dir = config_dir
    if config.name is None and name:
        try:
            config.name = name
        except ValidationError:
            raise ConfigError("name", f"unset, and the file name {shorten(name)} is not a valid name", NAME_RULE) from None
    problems = check_config(config)
    if problems:
        raise ConfigErrors(problems)
    return config


def _capped(errors: list[ConfigError]) -> list[ConfigError]:
    if len(errors) <= MAX_ERRORS_SHOWN:
        return errors
    rest = len(errors) - MAX_ERRORS_SHOWN
    return [*errors[:MAX_ERRORS_SHOWN], ConfigError("(more)", f"{rest} more problems not shown", "fix the ones above first")]


def load_config(path: str | Path) -> ForgeConfig:
    """The validated config in the YAML file at `path`; every problem names the file, line and field."""
    path = Path(path)
    document = read_yaml_document(path)

    def located(error: ConfigError) -> ConfigError:
        if error.source:  # read from another file (a checkpoint's config.json)
            return error
        line = document.line_of(error.where) if error.where else None
        return error.located(f"{path}:{line}" if line else str(path))

    try:
        config = parse_config(document.data, config_dir=path.resolve().parent, name=path.stem)
        config.config_file = path.resolve()
    except ConfigErrors as exc:
        raise ConfigErrors([located(e) for e in exc.errors]) from None
    except ConfigError as exc:
        raise located(exc) from None
    if binds_every_interface(config.triton.bind_address):
        from trtllm_forge.ui import warn

        warn(
            f"{located(ConfigError('triton.bind_address', '')).source}: triton.bind_address {config.triton.bind_address} "
            "listens on every interface: anyone who can reach this machine can use the server (127.0.0.1 keeps it local)"
        )
    return config
