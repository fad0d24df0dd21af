"""A trial's configuration as a YAML file `run` accepts from anywhere: the config's values with the knobs applied and
its relative paths made absolute (a file written elsewhere would otherwise resolve them from its own folder)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import yaml

from trtllm_forge.config.schema import ForgeConfig


def _absolute(config: ForgeConfig, value: str | None) -> str | None:
    if value is None or config.config_dir is None:
        return value
    path = config.resolve_path(value)
    return str(path) if path.exists() else value  # a built-in name (smollm2-135m) or a path on another host stays


def config_document(config: ForgeConfig) -> dict[str, Any]:
    """The config as a mapping for a YAML file, with every local path of its own made absolute."""
    data = config.model_dump(mode="json")
    model, spec = data["model"], data["engine"]["speculative"]
    model["source"] = _absolute(config, model["source"])
    model["tokenizer"] = _absolute(config, model["tokenizer"])
    spec["draft_model"] = _absolute(config, spec["draft_model"])
    calibration = data["quantization"]["calibration"]
    calibration["dataset"] = _absolute(config, calibration["dataset"])
    data["engine"]["plugins"]["custom_libraries"] = [_absolute(config, p) for p in data["engine"]["plugins"]["custom_libraries"]]
    for workload in data["bench"]["workloads"]:
        if workload.get("dataset"):
            workload["dataset"] = _absolute(config, workload["dataset"])
    return data


def config_yaml(config: ForgeConfig, header: str = "") -> str:
    comment = "".join(f"# {line}\n" for line in header.splitlines())
    return comment + yaml.safe_dump(config_document(config), sort_keys=False)


def config_hash(config: ForgeConfig, bench: dict[str, Any]) -> str:
    """What a trial's measurement depends on: the whole config and the bench settings it runs with."""
    text = json.dumps({"config": config.model_dump(mode="json"), "bench": bench}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
