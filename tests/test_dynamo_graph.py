"""Dynamo's GPU renderings (deploy/dynamo_graph.py): the DynamoGraphDeployment validated strictly against the pinned
v1beta1 schema of the operator's CRD (tests/fixtures/dynamo, with its SOURCE.txt), the engine YAMLs of both sides of a
disaggregated graph, replicas and GPUs, env values, the config rules, the one-host launch script, and plan's worker
accounting. Nothing here starts a server: the renderings are files."""

from __future__ import annotations

import copy
import hashlib
import json
import re
import shlex
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from conftest import CONFIGS
from trtllm_forge.builders.tensorrt_llm.llmapi import llm_api_options

from trtllm_forge.config import load_config
from trtllm_forge.config.schema import ForgeConfig
from trtllm_forge.deploy.dynamo_graph import (
    DGD_NAME_LIMIT,
    ENGINE_ARGS_MOUNT,
    dynamo_config_problems,
    render_dynamo_graph,
    render_dynamo_launch_script,
)
from trtllm_forge.errors import ConfigError
from trtllm_forge.plan.planner import make_plan
from trtllm_forge.plan.report import plan_to_dict

FIXTURES = Path(__file__).parent / "fixtures" / "dynamo"
EXAMPLE = CONFIGS / "llama3.1-8b-fp8-h100-dynamo-disagg.yaml"


# -- the pinned schema and the strict check ------------------------------------------------------------------------


def strictify(node: Any) -> Any:
    """additionalProperties: false on every node that lists properties and neither has additionalProperties nor
    x-kubernetes-preserve-unknown-fields: what the API server's strict field validation refuses (unknown fields),
    which the CRD's plain JSON schema lets through."""
    if isinstance(node, list):
        return [strictify(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: strictify(value) for key, value in node.items()}
    if "properties" in out and "additionalProperties" not in out and not out.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    return out


@cache
def strict_validator() -> jsonschema.Draft202012Validator:
    schema = strictify(json.loads((FIXTURES / "dynamographdeployment.v1beta1.schema.json").read_text()))
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def dgd_errors(document: dict[str, Any]) -> list[str]:
    assert document["apiVersion"] == "nvidia.com/v1beta1" and document["kind"] == "DynamoGraphDeployment"
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message[:200]}" for e in strict_validator().iter_errors(document)]


def test_pinned_schema_is_the_one_its_source_note_names():
    digest = hashlib.sha256((FIXTURES / "dynamographdeployment.v1beta1.schema.json").read_bytes()).hexdigest()
    source = (FIXTURES / "SOURCE.txt").read_text()
    assert f"This JSON: sha256 {digest}" in source
    assert re.search(r"wxsms/dynamo@[0-9a-f]{40}", source) and (FIXTURES / "LICENSE.dynamo.Apache-2.0").is_file()


def test_strict_check_accepts_nvidias_templates_and_refuses_unknown_fields():
    for name in ("nvidia-trtllm-agg.v1beta1.yaml", "nvidia-trtllm-disagg.v1beta1.yaml"):
        assert dgd_errors(yaml.safe_load((FIXTURES / name).read_text())) == [], name
    template = yaml.safe_load((FIXTURES / "nvidia-trtllm-disagg.v1beta1.yaml").read_text())
    v1alpha1_style = copy.deepcopy(template)
    v1alpha1_style["spec"]["services"] = {"Frontend": {"componentType": "frontend"}}
    assert any("services" in e for e in dgd_errors(v1alpha1_style))
    unknown_in_container = copy.deepcopy(template)
    unknown_in_container["spec"]["components"][1]["podTemplate"]["spec"]["containers"][0]["argz"] = ["x"]
    assert any("argz" in e for e in dgd_errors(unknown_in_container))
    bad_type = copy.deepcopy(template)
    bad_type["spec"]["components"][1]["type"] = "Decode"
    assert dgd_errors(bad_type)


# -- configs ---------------------------------------------------------------------------------------------------------


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def gpu_config(**overrides: Any) -> ForgeConfig:
    """The Dynamo example config with overrides. deploy.server is left out: the renderings do not read it, and this
    module tests them whether or not the dynamo kind is registered."""
    data = yaml.safe_load(EXAMPLE.read_text())
    data["deploy"].pop("server")
    return ForgeConfig.model_validate({**_merge(data, overrides), "config_dir": str(CONFIGS)})


def aggregated(**overrides: Any) -> ForgeConfig:
    """Aggregated, GPUs per worker from tp x pp."""
    return gpu_config(**_merge({"deploy": {"dynamo": {"disaggregated": False, "gpus_per_worker": None}}}, overrides))


def rendered(config: ForgeConfig, workdir: Path) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """(the DGD, the engine YAMLs of the ConfigMap by file name), after checking the file holds the returned text."""
    path, text = render_dynamo_graph(config, workdir)
    assert path == workdir / "deploy" / "dynamo-graph.yaml" and path.read_text() == text
    documents = list(yaml.safe_load_all(text))
    (graph,) = [d for d in documents if d["kind"] == "DynamoGraphDeployment"]
    (config_map,) = [d for d in documents if d["kind"] == "ConfigMap"]
    return graph, {name: yaml.safe_load(body) for name, body in config_map["data"].items()}


def components(graph: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in graph["spec"]["components"]}


def main_container(component: dict[str, Any]) -> dict[str, Any]:
    (container,) = component["podTemplate"]["spec"]["containers"]
    assert container["name"] == "main"  # the operator merges its defaults into "main"
    return container


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


# -- the DynamoGraphDeployment ---------------------------------------------------------------------------------------


def test_disaggregated_graph_is_valid_v1beta1_with_both_worker_roles(tmp_path):
    config = gpu_config()
    graph, engine_yamls = rendered(config, tmp_path)
    assert dgd_errors(graph) == []
    # The other documents, and each component's pod template, against Kubernetes' own schemas (strict).
    version = kubernetes_validate.latest_version()
    documents = list(yaml.safe_load_all((tmp_path / "deploy" / "dynamo-graph.yaml").read_text()))
    assert [d["kind"] for d in documents] == ["PersistentVolumeClaim", "ConfigMap", "DynamoGraphDeployment"]
    for document in documents[:2]:
        kubernetes_validate.validate(document, version, strict=True)
    for component in graph["spec"]["components"]:
        template = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": component["name"]}}
        kubernetes_validate.validate({**template, "template": component["podTemplate"]}, version, strict=True)
    parts = components(graph)
    assert {name: (c["type"], c["replicas"]) for name, c in parts.items()} == {
        "frontend": ("frontend", 1),
        "prefill": ("prefill", config.deploy.dynamo.prefill_workers),
        "decode": ("decode", config.deploy.dynamo.decode_workers),
    }
    for role in ("prefill", "decode"):
        argv = main_container(parts[role])["command"]
        assert argv[:3] == ["python3", "-m", "dynamo.trtllm"]
        assert flag(argv, "--disaggregation-mode") == role
        assert flag(argv, "--model") == config.model.source and flag(argv, "--served-model-name") == config.model.name
        assert flag(argv, "--kv-block-size") == str(config.engine.tokens_per_block)
        engine_file = flag(argv, "--extra-engine-args")
        assert engine_file == f"{ENGINE_ARGS_MOUNT}/{role}.yaml" and Path(engine_file).name in engine_yamls
        mounts = {m["mountPath"]: m["name"] for m in main_container(parts[role])["volumeMounts"]}
        assert mounts[ENGINE_ARGS_MOUNT] == "engine-args"
    # The KV router (router_mode kv) reads the prefill workers' cache events, as in NVIDIA's disagg template.
    assert "--publish-kv-events" in main_container(parts["prefill"])["command"]
    assert "--publish-kv-events" not in main_container(parts["decode"])["command"]
    frontend = main_container(parts["frontend"])["command"]
    assert frontend[:3] == ["python3", "-m", "dynamo.frontend"] and flag(frontend, "--router-mode") == "kv"


def test_both_sides_carry_the_same_cache_transceiver_and_prefill_drops_the_overlap_scheduler(tmp_path):
    extra = {"cache_transceiver_config": {"backend": "UCX"}}
    config = gpu_config(engine={"extra_llm_api_options": extra})
    _, engine_yamls = rendered(config, tmp_path)
    prefill, decode = engine_yamls["prefill.yaml"], engine_yamls["decode.yaml"]
    assert prefill["cache_transceiver_config"] == decode["cache_transceiver_config"]
    transceiver = prefill["cache_transceiver_config"]
    assert transceiver["backend"] == "UCX"  # the user's choice, on both sides
    assert transceiver["kv_transfer_timeout_ms"] > 0 and transceiver["max_tokens_in_buffer"] >= config.engine.max_seq_len
    assert prefill["disable_overlap_scheduler"] is True and "disable_overlap_scheduler" not in decode
    # Everything else is the config's LLM-API arguments, as trtllm-serve gets them.
    base = llm_api_options(config)
    for side in (prefill, decode):
        assert {k: v for k, v in side.items() if k not in ("cache_transceiver_config", "disable_overlap_scheduler")} == {
            k: v for k, v in base.items() if k != "cache_transceiver_config"
        }


def test_aggregated_graph_has_worker_replicas_and_kv_events_only_for_the_kv_router(tmp_path):
    config = aggregated(deploy={"dynamo": {"workers": 3}})
    graph, engine_yamls = rendered(config, tmp_path / "kv")
    assert dgd_errors(graph) == []
    parts = components(graph)
    assert {name: (c["type"], c["replicas"]) for name, c in parts.items()} == {"frontend": ("frontend", 1), "worker": ("worker", 3)}
    argv = main_container(parts["worker"])["command"]
    assert "--publish-kv-events" in argv and "--disaggregation-mode" not in argv
    assert "cache_transceiver_config" not in engine_yamls["worker.yaml"]
    assert "disable_overlap_scheduler" not in engine_yamls["worker.yaml"]

    graph, _ = rendered(aggregated(deploy={"dynamo": {"router_mode": "round-robin"}}), tmp_path / "rr")
    worker = main_container(components(graph)["worker"])
    assert "--publish-kv-events" not in worker["command"]
    assert flag(main_container(components(graph)["frontend"])["command"], "--router-mode") == "round-robin"

    # deploy.dynamo.kv_events false: the router's approximate mode, and no worker publishes
    graph, _ = rendered(aggregated(deploy={"dynamo": {"kv_events": False, "approximate_ttl_s": 60}}), tmp_path / "approximate")
    assert dgd_errors(graph) == []
    assert "--publish-kv-events" not in main_container(components(graph)["worker"])["command"]
    frontend = main_container(components(graph)["frontend"])["command"]
    assert flag(frontend, "--router-mode") == "kv" and "--no-router-kv-events" in frontend and flag(frontend, "--router-ttl-secs") == "60"

    # the KV router's weight of prefill against running load: Dynamo's default unless the config says otherwise
    assert flag(frontend, "--router-prefill-load-scale") == "1"
    graph, _ = rendered(aggregated(deploy={"dynamo": {"prefill_load_scale": 4}}), tmp_path / "scale")
    assert flag(main_container(components(graph)["frontend"])["command"], "--router-prefill-load-scale") == "4"
    graph, _ = rendered(aggregated(deploy={"dynamo": {"router_mode": "round-robin", "prefill_load_scale": 4}}), tmp_path / "rr-scale")
    assert "--router-prefill-load-scale" not in main_container(components(graph)["frontend"])["command"]


def test_gpus_per_worker_and_multinode(tmp_path):
    graph, engine_yamls = rendered(aggregated(parallel={"tp": 2}), tmp_path / "tp2")
    parts = components(graph)
    assert main_container(parts["worker"])["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert "nvidia.com/gpu" not in main_container(parts["frontend"])["resources"].get("limits", {})
    assert engine_yamls["worker.yaml"]["tensor_parallel_size"] == 2

    spread = aggregated(parallel={"tp": 8, "gpus_per_node": 4, "nodes": 2})
    graph, _ = rendered(spread, tmp_path / "nodes")
    assert dgd_errors(graph) == []
    worker = components(graph)["worker"]
    assert worker["multinode"] == {"nodeCount": 2}
    assert main_container(worker)["resources"]["limits"]["nvidia.com/gpu"] == "4"  # 8 ranks over 2 pods


def test_env_values_are_strings_even_when_yaml_would_read_a_boolean(tmp_path):
    config = gpu_config(deploy={"kubernetes": {"nccl_env": {"NCCL_DEBUG": "INFO", "NCCL_IB_DISABLE": "y", "NCCL_P2P_LEVEL": "1"}}})
    graph, _ = rendered(config, tmp_path)
    assert dgd_errors(graph) == []
    for component in graph["spec"]["components"]:
        env = {e["name"]: e["value"] for e in main_container(component)["env"]}
        assert all(isinstance(value, str) for value in env.values()), env
        assert env["NCCL_IB_DISABLE"] == "y" and env["NCCL_P2P_LEVEL"] == "1"  # quoted in the file, read back as text


def test_graph_name_stays_within_the_operators_limit(tmp_path):
    graph, _ = rendered(gpu_config(name="a-deployment-name-that-is-much-longer-than-forty-five-characters"), tmp_path)
    name = graph["metadata"]["name"]
    assert len(name) <= DGD_NAME_LIMIT and not name.endswith("-") and dgd_errors(graph) == []


# -- config rules ----------------------------------------------------------------------------------------------------


def problems_of(config: ForgeConfig) -> dict[str, str]:
    return {p.where: p.problem for p in dynamo_config_problems(config)}


def cpu_config(**dynamo: Any) -> ForgeConfig:
    data = load_config(CONFIGS / "smollm2-cpu.yaml").model_dump(mode="json", exclude_unset=True)
    return ForgeConfig.model_validate({**_merge(data, {"deploy": {"dynamo": dynamo}}), "config_dir": str(CONFIGS)})


def test_the_example_and_a_plain_cpu_graph_break_no_rule():
    assert problems_of(gpu_config()) == {}
    assert problems_of(cpu_config(workers=2)) == {}


def test_engine_target_is_refused_with_the_reason(tmp_path):
    config = gpu_config(engine={"target": "engine"})
    assert "PyTorch backend" in problems_of(config)["engine.target"]
    with pytest.raises(ConfigError, match=r"engine\.target.*set engine\.target: llmapi"):
        render_dynamo_graph(config, tmp_path)
    assert not (tmp_path / "deploy" / "dynamo-graph.yaml").exists()


def test_gpus_per_worker_must_be_tp_times_pp():
    assert (
        "parallel.tp x parallel.pp = 1"
        in problems_of(gpu_config(deploy={"dynamo": {"gpus_per_worker": 2}}))["deploy.dynamo.gpus_per_worker"]
    )
    assert problems_of(gpu_config(parallel={"tp": 2}, deploy={"dynamo": {"gpus_per_worker": 2}})) == {}


def test_kv_router_needs_kv_cache_reuse_on_gpu():
    problem = problems_of(gpu_config(runtime={"enable_kv_cache_reuse": False}))["deploy.dynamo.router_mode"]
    assert "enable_kv_cache_reuse" in problem
    assert problems_of(gpu_config(runtime={"enable_kv_cache_reuse": False}, deploy={"dynamo": {"router_mode": "random"}})) == {}


def test_disaggregated_and_gpus_per_worker_are_gpu_only():
    found = problems_of(cpu_config(disaggregated=True, gpus_per_worker=1))
    assert set(found) == {"deploy.dynamo.disaggregated", "deploy.dynamo.gpus_per_worker"}


# -- the one-host launch script --------------------------------------------------------------------------------------


def commands(script: str) -> list[tuple[dict[str, str], list[str]]]:
    """(environment assignments, argv) of each background command of the script."""
    out = []
    for line in script.splitlines():
        if not line.endswith(" &"):
            continue
        words = shlex.split(line[: -len(" &")])
        env = {}
        while "=" in words[0] and not words[0].startswith("-"):
            key, _, value = words.pop(0).partition("=")
            env[key] = value
        out.append((env, words))
    return out


def test_launch_script_starts_the_same_graph_on_disjoint_gpus(tmp_path):
    config = gpu_config(parallel={"tp": 2}, deploy={"dynamo": {"gpus_per_worker": 2}})
    graph, engine_yamls = rendered(config, tmp_path)
    path, text = render_dynamo_launch_script(config, tmp_path)
    assert path.read_text() == text and path.stat().st_mode & 0o111
    assert "never run" in text.lower()
    assert subprocess.run(["sh", "-n", str(path)], capture_output=True).returncode == 0  # the shell parses it
    started = commands(text)
    workers = [(env, argv) for env, argv in started if argv[:3] == ["python3", "-m", "dynamo.trtllm"]]
    frontends = [argv for _, argv in started if argv[:3] == ["python3", "-m", "dynamo.frontend"]]
    assert len(frontends) == 1 and flag(frontends[0], "--router-mode") == "kv"
    assert flag(frontends[0], "--http-host") == config.triton.bind_address
    modes = [flag(argv, "--disaggregation-mode") for _, argv in workers]
    assert modes.count("prefill") == 2 and modes.count("decode") == 2
    devices = [env["CUDA_VISIBLE_DEVICES"].split(",") for env, _ in workers]
    assert all(len(d) == 2 for d in devices) and len({gpu for d in devices for gpu in d}) == 8
    # The same worker flags as the cluster's pods, but with engine YAML files on this host holding the same arguments.
    pods = {c["name"]: main_container(c)["command"] for c in graph["spec"]["components"]}
    for _, argv in workers:
        role = flag(argv, "--disaggregation-mode")
        engine_file = Path(flag(argv, "--extra-engine-args"))
        assert yaml.safe_load(engine_file.read_text()) == engine_yamls[f"{role}.yaml"]
        assert [a for a in argv if a != str(engine_file)] == [a for a in pods[role] if a != f"{ENGINE_ARGS_MOUNT}/{role}.yaml"]


def test_launch_script_refuses_a_graph_larger_than_one_host(tmp_path):
    config = gpu_config(parallel={"tp": 4}, deploy={"dynamo": {"gpus_per_worker": 4}})  # 4 workers x 4 GPUs > 8
    with pytest.raises(ConfigError, match=r"deploy\.dynamo: the graph needs 16 GPUs"):
        render_dynamo_launch_script(config, tmp_path)


# -- plan ------------------------------------------------------------------------------------------------------------


def test_plan_accounts_for_the_workers():
    config = gpu_config()
    plan = make_plan(config)
    workers = plan_to_dict(plan)["dynamo"]
    dynamo = config.deploy.dynamo
    assert workers["mode"] == "disaggregated"
    assert workers["workers"] == {"aggregated": 0, "prefill": dynamo.prefill_workers, "decode": dynamo.decode_workers}
    assert workers["gpus"] == config.parallel.world_size * (dynamo.prefill_workers + dynamo.decode_workers)
    assert workers["kv_tokens_per_worker"] == plan.kv.max_tokens
    assert workers["concurrent_sequences"] == plan.max_concurrent_sequences * dynamo.decode_workers
    assert workers["kv_bytes_per_worker"] == plan.kv.max_tokens * sum(r.kv_bytes_per_token for r in plan.memory)

    without = load_config(CONFIGS / "llama3.1-8b-fp8-h100.yaml")
    assert "dynamo" not in plan_to_dict(make_plan(without))
