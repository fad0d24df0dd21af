"""The server kinds (`deploy.server`) as the config knows them: one line each in SERVER_KINDS, the first the default.

Standard library only: the config schema (its `deploy.server` choices and description) and the config rules read
this below every stage. What a kind does (start, status, stop, render, the deployment it hands to smoke, verify and
bench) is its module under `deploy/kinds/`, named by `implementation` and loaded by `deploy/kinds/__init__.py`.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ServerKindEntry:
    name: str  # the deploy.server value
    summary: str  # one line for the config schema's description of deploy.server
    implementation: str  # "module:attribute" of its ServerKind instance (deploy/kinds/protocol.py)
    # "module:function" of each rule applied to configs with this deploy.server (function(config) yields
    # ConfigError); each becomes a named rule in config/checks.py RULES.
    config_rules: tuple[str, ...] = ()
    # "module:function" giving (count, what it is) of the engines serving at once (plan's serving model, tune);
    # empty: one engine.
    engine_instances: str = ""
    # "module:function" giving (default knobs, extra knobs) of this kind for `tune` (tune/space.py); empty: none.
    tuning_knobs: str = ""

    @property
    def rule_names(self) -> tuple[str, ...]:
        return tuple(reference.partition(":")[2] for reference in self.config_rules)


SERVER_KINDS: tuple[ServerKindEntry, ...] = (
    ServerKindEntry(
        "triton",
        "Triton on the rendered model repository (KServe v2 over gRPC and HTTP)",
        "trtllm_forge.deploy.kinds.triton:KIND",
        engine_instances="trtllm_forge.plan.serving_model:triton_engine_instances",
        tuning_knobs="trtllm_forge.tune.space:triton_knobs",
    ),
    ServerKindEntry(
        "trtllm-serve",
        "trtllm-serve, OpenAI-compatible, on the llmapi build (engine.target llmapi; on CPU the LLM-API stand-in's server)",
        "trtllm_forge.deploy.kinds.trtllm_serve:KIND",
        config_rules=(
            "trtllm_forge.deploy.kinds.trtllm_serve:trtllm_serve_needs_llmapi",
            "trtllm_forge.deploy.kinds.trtllm_serve:trtllm_serve_bench_is_openai",
        ),
    ),
    ServerKindEntry(
        "dynamo",
        "NVIDIA Dynamo, OpenAI-compatible: a frontend with a KV-aware router in front of deploy.dynamo.workers workers (locally: our CPU engine; kubernetes: a DynamoGraphDeployment)",
        "trtllm_forge.deploy.kinds.dynamo:KIND",
        config_rules=(
            "trtllm_forge.deploy.kinds.dynamo:dynamo_bench_is_openai",
            "trtllm_forge.deploy.dynamo_graph:dynamo_config_problems",
        ),
        engine_instances="trtllm_forge.plan.workers:dynamo_engine_instances",
        tuning_knobs="trtllm_forge.tune.space:dynamo_knobs",
    ),
)
DEFAULT_SERVER_KIND = SERVER_KINDS[0].name


def entry_for(name: str) -> ServerKindEntry:
    return next(entry for entry in SERVER_KINDS if entry.name == name)


def resolve(reference: str) -> Any:
    """The attribute a "module:attribute" reference of an entry names (imported when asked: the entries stay
    below every stage)."""
    module_name, _, attribute = reference.partition(":")
    return getattr(importlib.import_module(module_name), attribute)
