"""The Builder protocol and its registry: every (engine.backend, engine.target) of the schema has a builder or is
refused when the config is loaded, each shipped config plans through its builder without running anything, and a
config without a builder is one clear error."""

from __future__ import annotations

from pathlib import Path
from typing import get_args

import pytest
from conftest import CONFIGS
from trtllm_forge.builders import registry

from trtllm_forge.config.load import load_config, parse_config
from trtllm_forge.config.schema import EngineConfig
from trtllm_forge.errors import ConfigError, ConfigErrors

SHIPPED = sorted(CONFIGS.glob("*.yaml"))
PROTOCOL_METHODS = ("plan", "commands", "describe", "show_dry_run", "execute")


def test_every_backend_and_target_of_the_schema_has_a_builder_or_is_refused_by_the_config():
    backends = get_args(EngineConfig.model_fields["backend"].annotation)
    targets = get_args(EngineConfig.model_fields["target"].annotation)
    base = load_config(CONFIGS / "smollm2-cpu.yaml").model_dump(mode="json", exclude_defaults=True)
    refused = []
    for backend in backends:
        for target in targets:
            if (backend, target) in registry.BUILDERS:
                continue
            data = {**base, "engine": {**base.get("engine", {}), "backend": backend, "target": target}}
            with pytest.raises(ConfigErrors) as caught:
                parse_config(data, name="t")
            assert any(e.where == "engine.target" for e in caught.value.errors), (backend, target)
            refused.append((backend, target))
    assert refused == [("onnxruntime", "llmapi")]  # the CPU LLM-API stand-in serves OpenVINO IR only


@pytest.mark.parametrize("config_file", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_each_shipped_config_plans_through_its_builder(config_file, tmp_path):
    config = load_config(config_file)
    builder = registry.builder_for(config)
    assert all(callable(getattr(builder, name, None)) for name in PROTOCOL_METHODS)
    checkpoint = tmp_path / "checkpoint"  # not there: planning reads no weights
    plan_doc, commands = registry.dry_run_commands(config, tmp_path / "wd", checkpoint)
    assert commands and all(isinstance(argv, list) and all(isinstance(a, str) for a in argv) for argv in commands)
    assert isinstance(plan_doc, dict) and plan_doc
    assert not (tmp_path / "wd").exists(), "planning must write nothing"


def test_a_config_without_a_builder_is_one_config_error(tmp_path, monkeypatch):
    config = load_config(CONFIGS / "smollm2-cpu.yaml")
    monkeypatch.delitem(registry.BUILDERS, ("openvino", "engine"))
    with pytest.raises(ConfigError) as caught:
        registry.builder_for(config)
    assert caught.value.where == "engine.backend" and "tensorrt-llm/engine" in str(caught.value)


def test_a_registered_builder_is_used(monkeypatch, tmp_path):
    config = load_config(CONFIGS / "smollm2-cpu.yaml")
    monkeypatch.setitem(registry.BUILDERS, ("openvino", "engine"), f"{__name__}:RecordingBuilder")
    result = registry.build(config, tmp_path, Path("/ckpt"))
    assert result == ("executed", "planned /ckpt")


def test_a_builder_whose_module_is_missing_is_one_config_error(monkeypatch):
    config = load_config(CONFIGS / "smollm2-cpu.yaml")
    monkeypatch.setitem(registry.BUILDERS, ("openvino", "engine"), "trtllm_forge.builders.not_installed:Builder")
    with pytest.raises(ConfigError, match="not available in this installation"):
        registry.builder_for(config)


class RecordingBuilder:
    def plan(self, config, workdir, checkpoint_dir):
        return f"planned {checkpoint_dir}"

    def commands(self, plan):
        return []

    def describe(self, plan):
        return {}

    def show_dry_run(self, config, workdir, plan, as_json):
        pass

    def execute(self, config, workdir, plan, force=False):
        return ("executed", plan)
