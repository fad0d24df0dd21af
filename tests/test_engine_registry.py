"""The engine registry (builders/engines.py) is the one place backends are listed: every list derived from it equals
it, every CPU engine's served adapter is beside the CPU engine model and provides the adapter protocol, and the
descriptors stay below the config (they import nothing that imports it)."""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path
from typing import get_args

import pytest
from conftest import CONFIGS, REPO
from trtllm_forge.builders import registry
from trtllm_forge.builders.engines import BACKENDS, CPU_ADAPTERS, CPU_BACKENDS, ENGINES, engine_of
from trtllm_forge.model_repo_templates.cpu.tensorrt_llm.engine_adapter import ADAPTER_NAMES, STATUS_NAMES, load_adapter

from trtllm_forge.config import schema
from trtllm_forge.config.load import load_config

CPU_MODEL_DIR = REPO / "model_repo_templates" / "cpu" / "tensorrt_llm"
CPU_ENGINES = [engine for engine in ENGINES if engine.on_cpu]


def test_the_schema_lists_are_the_registry():
    assert get_args(schema.EngineConfig.model_fields["backend"].annotation) == BACKENDS == tuple(e.backend for e in ENGINES)
    assert schema.CPU_BACKENDS == CPU_BACKENDS == ("openvino", "onnxruntime")
    assert schema.EngineConfig.model_fields["backend"].default == ENGINES[0].backend
    for engine in ENGINES:
        assert schema.EngineConfig(backend=engine.backend).on_cpu is engine.on_cpu


def test_the_builder_table_is_the_descriptors_builders():
    assert {(e.backend, target): ref for e in ENGINES for target, ref in e.builders.items()} == registry.BUILDERS
    for reference in registry.BUILDERS.values():
        module, _, name = reference.partition(":")
        path = REPO / "builders" / Path(*module.split(".")[2:]).with_suffix(".py")
        assert f"class {name}" in path.read_text(), reference  # the class is where the reference says


def test_render_copies_every_served_adapter_and_the_protocol():
    from trtllm_forge.render.templates import CPU_ENGINE_SIBLINGS

    assert tuple(engine.served_adapter for engine in CPU_ENGINES) == CPU_ADAPTERS
    assert {f"{adapter}.py" for adapter in CPU_ADAPTERS} | {"engine_adapter.py"} <= set(CPU_ENGINE_SIBLINGS)
    for sibling in CPU_ENGINE_SIBLINGS:
        assert (CPU_MODEL_DIR / sibling).is_file(), sibling


@pytest.mark.parametrize("engine", CPU_ENGINES, ids=lambda e: e.backend)
def test_each_served_adapter_provides_the_protocol(engine, monkeypatch):
    monkeypatch.syspath_prepend(str(CPU_MODEL_DIR))  # as in the Triton model directory: siblings import each other
    for name in ("engine_adapter", engine.served_adapter):
        monkeypatch.delitem(sys.modules, name, raising=False)
    adapter = load_adapter(engine.served_adapter)
    assert all(hasattr(adapter, name) for name in ADAPTER_NAMES)
    assert all(hasattr(adapter.GenerationStatus, name) for name in STATUS_NAMES)
    assert engine.title in adapter.ENGINE_VERSION
    config = adapter.GenerationConfig()
    config.max_new_tokens = 4  # a field genai_settings and model.py set
    config.validate()
    scheduler = adapter.SchedulerConfig()
    scheduler.max_num_seqs = 2


def test_an_engine_without_an_adapter_name_is_refused_with_the_fix():
    with pytest.raises(ValueError, match="rebuild the engine"):
        load_adapter(None)
    with pytest.raises(ValueError, match="names no adapter"):
        load_adapter("../model")


@pytest.mark.parametrize("engine", ENGINES, ids=lambda e: e.backend)
def test_the_engine_config_records_the_served_adapter(engine, tmp_path):
    from trtllm_forge.engine_config import ADAPTER_KEY, write_engine_config

    path = write_engine_config(tmp_path, version="1", engine=engine, pretrained_config={}, build_config={})
    written = json.loads(path.read_text())
    assert written["backend"] == engine.backend
    assert written.get(ADAPTER_KEY) == engine.served_adapter


def test_version_and_doctor_list_every_engine_component():
    from trtllm_forge.components import COMPONENTS, installed_versions

    distributions = [c.distribution for c in COMPONENTS]
    for engine in ENGINES:
        assert {c.distribution for c in engine.components} <= set(distributions)
    assert "onnxruntime-genai" in installed_versions()
    assert len(distributions) == len(set(distributions))


def test_the_plan_note_and_default_dtype_come_from_the_descriptor():
    from trtllm_forge.dtypes import resolve_model_dtype
    from trtllm_forge.plan.planner import make_plan

    config = load_config(CONFIGS / "smollm2-cpu-onnxruntime.yaml")
    plan = make_plan(config)
    tokens = config.engine.max_batch_size * config.engine.max_seq_len
    assert f"max_seq_len per sequence: {tokens} tokens" in " ".join(plan.notes)
    unreadable = load_config(CONFIGS / "smollm2-cpu.yaml").model_copy(deep=True)
    unreadable.model.source, unreadable.model.dtype = "/nowhere/model", "auto"  # no checkpoint says a dtype
    for engine in ENGINES:
        unreadable.engine.backend = engine.backend
        assert resolve_model_dtype(unreadable) == engine.default_dtype


# Modules the config imports from builders/: they must import nothing but each other and the standard library.
DESCRIPTOR_MODULES = [
    "builders/descriptor.py",
    "builders/engines.py",
    *(f"builders/{p.parent.name}/engine.py" for p in (REPO / "builders").glob("*/engine.py")),
]


@pytest.mark.parametrize("relative", DESCRIPTOR_MODULES)
def test_descriptors_stay_below_the_config(relative):
    allowed = {f"trtllm_forge.{Path(m).with_suffix('').as_posix().replace('/', '.')}" for m in DESCRIPTOR_MODULES}
    tree = ast.parse((REPO / relative).read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("trtllm_forge"):
            assert node.module in allowed, f"{relative} imports {node.module}"
        if isinstance(node, ast.Import):
            assert not any(alias.name.startswith("trtllm_forge") for alias in node.names), relative
    assert engine_of(ENGINES[0].backend) is ENGINES[0]
