"""The Kubernetes renderings checked against the Kubernetes schemas (kubernetes-validate, strict: unknown fields
are errors), including the LeaderWorkerSet of a multi-node deployment.

LeaderWorkerSet is a CRD, so kubernetes-validate has no schema for it (asserted below). What is checked instead:
its two pod templates against the core v1 PodTemplate schema, and its own fields against the LWS v1 API
(kubernetes-sigs/lws@47a6181f:api/leaderworkerset/v1/leaderworkerset_types.go: leaderWorkerTemplate.workerTemplate
required; size, replicas int32; restartPolicy and startupPolicy enums).
"""

from __future__ import annotations

import copy

import jsonschema
import kubernetes_validate
import pytest
import yaml
from cli_inprocess import run_in_process
from trtllm_helpers import REPO

ENGINES = REPO / "tests" / "fixtures" / "engines"
K8S_VERSION = kubernetes_validate.latest_version()
FORGE_1_2_1 = "trtllm-forge:0.1.0-trtllm1.2.1"
LWS_V1 = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "leaderworkerset.x-k8s.io/v1"},
        "kind": {"const": "LeaderWorkerSet"},
        "metadata": {"type": "object", "required": ["name"]},
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "required": ["leaderWorkerTemplate"],
            "properties": {
                "replicas": {"type": "integer", "minimum": 0, "maximum": 2**31 - 1},
                "startupPolicy": {"enum": ["LeaderCreated", "LeaderReady"]},
                "rolloutStrategy": {"type": "object"},
                "networkConfig": {"type": "object"},
                "leaderWorkerTemplate": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["workerTemplate"],
                    "properties": {
                        "leaderTemplate": {"type": "object"},
                        "workerTemplate": {"type": "object"},
                        "size": {"type": "integer", "minimum": 1, "maximum": 2**31 - 1},
                        "restartPolicy": {"enum": ["Default", "RecreateGroupOnPodRestart", "None"]},
                        "subGroupPolicy": {"type": "object"},
                        "volumeClaimTemplates": {"type": "array"},
                        "persistentVolumeClaimRetentionPolicy": {"type": "object"},
                    },
                },
            },
        },
    },
}


def validate(document: dict) -> None:
    kubernetes_validate.validate(document, K8S_VERSION, strict=True)


def validate_lws(document: dict) -> None:
    jsonschema.validate(document, LWS_V1)
    templates = document["spec"]["leaderWorkerTemplate"]
    for role in ("leaderTemplate", "workerTemplate"):
        validate({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": f"lws-{role.lower()}"}, "template": templates[role]})


def _config(tmp_path, **overrides) -> str:
    data = yaml.safe_load((REPO / "configs" / "llama3.1-70b-fp8-h200-tp4.yaml").read_text())
    for section, values in overrides.items():
        data.setdefault(section, {}).update(values)
    path = tmp_path / "gpu.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def _rendered_kubernetes(tmp_path, config: str) -> list[dict]:
    workdir = tmp_path / "wd"
    rendered = run_in_process("render", config, "--engine-dir", str(ENGINES / "llama3.1-70b-fp8-h200-tp4"), "--workdir", str(workdir))
    assert rendered.returncode == 0, rendered.stderr
    result = run_in_process("deploy", config, "--workdir", str(workdir), "--target", "kubernetes", "--dry-run")
    assert result.returncode == 0, result.stderr
    return list(yaml.safe_load_all(result.stdout))


def test_single_node_gpu_manifests_pass_the_kubernetes_schemas(tmp_path):
    documents = _rendered_kubernetes(tmp_path, _config(tmp_path))
    assert [d["kind"] for d in documents] == ["Deployment", "Service"]
    for document in documents:
        validate(document)
    container = documents[0]["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == FORGE_1_2_1  # the serving image of the engine's TensorRT-LLM, from the table
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "4"


def test_multi_node_renders_a_leaderworkerset_that_passes_its_schemas(tmp_path):
    documents = _rendered_kubernetes(tmp_path, _config(tmp_path, parallel={"nodes": 2, "gpus_per_node": 2}))
    lws, service = documents
    assert lws["kind"] == "LeaderWorkerSet"
    with pytest.raises(kubernetes_validate.SchemaNotFoundError):
        validate(lws)  # a CRD: not among the Kubernetes schemas, hence validate_lws
    validate_lws(lws)
    validate(service)
    template = lws["spec"]["leaderWorkerTemplate"]
    assert template["size"] == 2
    leader = template["leaderTemplate"]["spec"]["containers"][0]
    worker = template["workerTemplate"]["spec"]["containers"][0]
    assert leader["image"] == worker["image"] == FORGE_1_2_1
    assert leader["resources"]["limits"]["nvidia.com/gpu"] == worker["resources"]["limits"]["nvidia.com/gpu"] == "2"
    script = leader["command"][2]
    assert leader["command"][:2] == ["/bin/sh", "-c"] and 'exec mpirun --allow-run-as-root -H "$hosts" -n 1 ' in script
    assert script.count(" : -n 1 ") == 3  # four ranks over the two pods
    assert "ports" in leader and "ports" not in worker
    assert service["spec"]["selector"] == template["leaderTemplate"]["metadata"]["labels"]


def test_the_schema_checks_catch_a_broken_manifest(tmp_path):
    """The validators are not vacuous: an unknown field or a wrong type fails them."""
    documents = _rendered_kubernetes(tmp_path, _config(tmp_path, parallel={"nodes": 2, "gpus_per_node": 2}))
    lws = copy.deepcopy(documents[0])
    lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]["gpus"] = 2
    with pytest.raises(kubernetes_validate.ValidationError):
        validate_lws(lws)
    lws = copy.deepcopy(documents[0])
    lws["spec"]["leaderWorkerTemplate"]["size"] = "2"
    with pytest.raises(jsonschema.ValidationError):
        validate_lws(lws)


def test_ranks_that_do_not_divide_over_the_nodes_are_refused(tmp_path):
    config = _config(tmp_path, parallel={"nodes": 3, "gpus_per_node": 2})
    workdir = tmp_path / "wd"
    assert (
        run_in_process("render", config, "--engine-dir", str(ENGINES / "llama3.1-70b-fp8-h200-tp4"), "--workdir", str(workdir)).returncode
        == 0
    )
    result = run_in_process("deploy", config, "--workdir", str(workdir), "--target", "kubernetes", "--dry-run")
    assert result.returncode == 2 and "parallel.nodes: tp x pp = 4 ranks cannot be spread evenly over 3 nodes" in result.stderr


def test_cpu_manifests_pass_the_kubernetes_schemas(tmp_path):
    config = REPO / "configs" / "smollm2-cpu.yaml"
    repo = tmp_path / "repo"
    repo.mkdir()
    result = run_in_process(
        "deploy", str(config), "--workdir", str(tmp_path / "wd"), "--repository", str(repo), "--target", "kubernetes", "--dry-run"
    )
    assert result.returncode == 0, result.stderr
    for document in yaml.safe_load_all(result.stdout):
        validate(document)
