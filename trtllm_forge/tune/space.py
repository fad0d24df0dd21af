"""The knobs `tune` turns, per server kind and engine, and the grid of points they span (`--space FILE` changes it).

A knob is a dotted config path (`engine.max_batch_size`). Its `stage` says what a change costs: `build` rewrites the
engine's config (the OpenVINO/ONNX Runtime export itself is reused, builders/cpu_export.reuse_previous_export),
`render` only re-renders the repository, `deploy` only restarts the server.
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from trtllm_forge.config.schema import ForgeConfig
from trtllm_forge.errors import ConfigError
from trtllm_forge.model_repo_templates.cpu.tensorrt_llm.genai_settings import ARRIVAL_WINDOW_MS

Scalar = int | float | bool | str | None
Point = dict[str, Scalar]
Stage = Literal["build", "render", "deploy"]
MAX_POINTS = 4096  # a grid past this is refused: every point is checked before any trial


@dataclass(frozen=True)
class Knob:
    name: str  # dotted config path
    values: tuple[Scalar, ...]
    stage: Stage
    help: str


def config_value(config: ForgeConfig, name: str) -> Any:
    """The value at a dotted path of the config (as YAML would hold it); KeyError when it has none."""
    node: Any = config.model_dump(mode="json")
    for part in name.split("."):
        if not isinstance(node, dict) or part not in node:
            raise KeyError(name)
        node = node[part]
    return node


def _around(value: int, low: int = 1) -> tuple[int, ...]:
    return tuple(sorted({max(low, value // 2), value, value * 2}))


def _cpu_knobs(config: ForgeConfig) -> list[Knob]:
    eng, rt = config.engine, config.runtime
    kv = rt.max_tokens_in_paged_kv_cache or 16384
    knobs = [
        Knob("engine.max_batch_size", _around(eng.max_batch_size), "build", "sequences in one engine step"),
        Knob("engine.max_num_tokens", _around(eng.resolved_max_num_tokens), "build", "tokens per engine step (batched-token budget)"),
        Knob("runtime.max_tokens_in_paged_kv_cache", _around(kv), "render", "KV-cache size in tokens"),
    ]
    if config.engine.target != "llmapi":
        window = rt.arrival_window_ms if rt.arrival_window_ms is not None else ARRIVAL_WINDOW_MS
        knobs.append(Knob("runtime.arrival_window_ms", tuple(sorted({0, window})), "render", "wait for arrivals to share a prefill"))
    return knobs


def _gpu_knobs(config: ForgeConfig) -> list[Knob]:
    from trtllm_forge.config.checks import shape_for

    eng, par = config.engine, config.parallel
    gpus = config.hardware.count or par.gpus_per_node
    knobs = [
        Knob("engine.max_batch_size", _around(eng.max_batch_size), "build", "sequences in one step"),
        Knob("engine.max_num_tokens", _around(eng.resolved_max_num_tokens, 256), "build", "tokens per step"),
        Knob("runtime.kv_cache_free_gpu_mem_fraction", (0.8, 0.9, 0.95), "build", "share of free GPU memory for the KV cache"),
        Knob("parallel.tp", tuple(t for t in (1, 2, 4, 8) if t <= gpus), "build", "tensor-parallel size"),
        Knob("parallel.pp", tuple(p for p in (1, 2) if p <= gpus), "build", "pipeline-parallel size"),
    ]
    shape = shape_for(config)
    if shape is not None and shape.is_moe:
        knobs.append(Knob("parallel.moe_ep", tuple(e for e in (1, 2, 4, 8) if e <= gpus), "build", "expert-parallel size"))
    if eng.target == "llmapi":
        knobs.append(
            Knob(
                "engine.extra_llm_api_options.cuda_graph_config.enable_padding", (True, False), "build", "CUDA graphs padded to batch sizes"
            )
        )
    return knobs


def dynamo_knobs(config: ForgeConfig) -> tuple[list[Knob], list[Knob]]:
    """Dynamo's knobs (server_kinds.py names this function): its workers; on a GPU, aggregated or disaggregated."""
    if config.engine.on_cpu:
        return [Knob("deploy.dynamo.workers", (1, 2), "deploy", "engine workers behind the router")], []
    return [
        Knob("deploy.dynamo.disaggregated", (False, True), "deploy", "prefill and decode on separate workers"),
        Knob("deploy.dynamo.workers", (1, 2), "deploy", "aggregated workers"),
        Knob("deploy.dynamo.prefill_workers", (1, 2), "deploy", "prefill workers (disaggregated)"),
        Knob("deploy.dynamo.decode_workers", (1, 2), "deploy", "decode workers (disaggregated)"),
    ], []


def triton_knobs(config: ForgeConfig) -> tuple[list[Knob], list[Knob]]:
    """Triton's knobs (server_kinds.py names this function): the tokenizer and detokenizer models' instances on the
    engine path; on a CPU engine, `--space FILE` may also name the engine model's instances (each runs an engine)."""
    default = []
    if config.engine.target != "llmapi":
        default = [
            Knob("triton.instances.preprocessing", (1, 2), "render", "tokenizer model instances"),
            Knob("triton.instances.postprocessing", (1, 2), "render", "detokenizer model instances"),
        ]
    extra = []
    if config.engine.on_cpu:
        extra = [Knob("triton.instances.tensorrt_llm", (config.triton.instances.tensorrt_llm,), "render", "engine model instances")]
    return default, extra


def _server_knobs(config: ForgeConfig) -> tuple[list[Knob], list[Knob]]:
    """(default, extra) knobs of the config's server kind; extra ones are fixed at the config's value unless
    `--space FILE` names them."""
    from trtllm_forge.server_kinds import entry_for, resolve

    reference = entry_for(config.deploy.server).tuning_knobs
    return resolve(reference)(config) if reference else ([], [])


def default_space(config: ForgeConfig) -> list[Knob]:
    """The knobs this config's engine and server kind really have, each around the config's own value."""
    engine = _cpu_knobs(config) if config.engine.on_cpu else _gpu_knobs(config)
    return [*engine, *_server_knobs(config)[0]]


def known_knobs(config: ForgeConfig) -> dict[str, Knob]:
    return {knob.name: knob for knob in [*default_space(config), *_server_knobs(config)[1]]}


def default_point(config: ForgeConfig, knobs: list[Knob]) -> Point:
    """The config's own value of every knob (None where the config leaves it to the engine's default)."""
    point: Point = {}
    for knob in knobs:
        try:
            point[knob.name] = config_value(config, knob.name)
        except KeyError:
            point[knob.name] = None
    return point


def read_space(path: Path, config: ForgeConfig) -> list[Knob]:
    """The default space with the knobs `path` names set to its values: `knob: [values]` per line (one value fixes
    the knob, more values than the default widen it). An unknown knob or a value that is not a list of plain values
    is refused naming the file and the knob."""
    from trtllm_forge.config.yaml_reader import read_yaml_document

    if not path.is_file():
        raise ConfigError("--space", f"{path}: not found", "pass a YAML file of `knob: [values]` lines")
    data = read_yaml_document(path).data
    known = known_knobs(config)
    chosen = {knob.name: knob for knob in default_space(config)}
    for name, values in data.items():
        knob = known.get(str(name))
        if knob is None:
            raise ConfigError(str(name), "unknown knob", f"knobs for this config: {', '.join(known)}", source=str(path))
        if not isinstance(values, list) or not values or not all(_scalar(v) for v in values):
            raise ConfigError(str(name), f"{values!r} is not a list of values", f"e.g. {name}: [1, 2]", source=str(path))
        if len(set(map(repr, values))) != len(values):
            raise ConfigError(str(name), "a value is listed twice", "list each value once", source=str(path))
        chosen[knob.name] = Knob(knob.name, tuple(values), knob.stage, knob.help)
    return list(chosen.values())


def _scalar(value: object) -> bool:
    return value is None or (isinstance(value, int | float | str | bool) and not (isinstance(value, float) and not math.isfinite(value)))


def grid(knobs: list[Knob]) -> list[Point]:
    """Every combination of the knobs' values, in a fixed order."""
    size = math.prod(len(knob.values) for knob in knobs)
    if size > MAX_POINTS:
        raise ConfigError("--space", f"{size} points", f"at most {MAX_POINTS}: fix some knobs to one value in a --space file")
    return [dict(zip([k.name for k in knobs], values, strict=True)) for values in itertools.product(*(k.values for k in knobs))]


def describe_point(point: Point) -> str:
    return " ".join(f"{name.rsplit('.', 1)[-1]}={value}" for name, value in point.items())


def point_key(point: Point) -> str:
    """The same text for the same knob values, whatever their order (trial.json stores them sorted)."""
    return json.dumps(point, sort_keys=True)
