"""The Kubernetes renderings, parsed and checked: against the Kubernetes schemas (kubernetes-validate, strict:
unknown fields are errors), and for the properties that make them start — every path a model reads is mounted (at
the same path, read-only), every rank binds where its probes and the Service connect, the LeaderWorkerSet's leader
gives mpirun `pod:slots` with slots = GPUs per pod after waiting for its workers (its shell is RUN here, with a FAKE
kubectl and mpirun that record their arguments), storage is a PersistentVolumeClaim.

LeaderWorkerSet is a CRD, so kubernetes-validate has no schema for it (asserted below). What is checked instead:
its two pod templates against the core v1 PodTemplate schema, and its own fields against the LWS v1 API
(kubernetes-sigs/lws@47a6181f:api/leaderworkerset/v1/leaderworkerset_types.go: leaderWorkerTemplate.workerTemplate
required; size, replicas int32; restartPolicy and startupPolicy enums).
"""

from __future__ import annotations

import copy
import os
import re
import stat
import subprocess
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml
from cli_inprocess import run_in_process
from trtllm_helpers import REPO

ENGINES = REPO / "tests" / "fixtures" / "engines"
K8S_VERSION = kubernetes_validate.latest_version()
FORGE_1_2_1 = "trtllm-forge:0.1.0-trtllm1.2.1"
NGC_26_07 = "nvcr.io/nvidia/tritonserver:26.07-trtllm-python-py3"
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


ENGINE_70B = ENGINES / "llama3.1-70b-fp8-h200-tp4"
CONFIG_405B = REPO / "configs" / "llama3.1-405b-bf16-h100x16-2node.yaml"


def _config(tmp_path, source: Path = REPO / "configs" / "llama3.1-70b-fp8-h200-tp4.yaml", **overrides) -> str:
    data = yaml.safe_load(source.read_text())
    for section, values in overrides.items():
        data.setdefault(section, {}).update(values)
    path = tmp_path / f"{data['name']}.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def _deploy_dry_run(config: str, workdir: Path, *extra: str) -> list[dict]:
    result = run_in_process("deploy", config, "--workdir", str(workdir), "--target", "kubernetes", "--dry-run", *extra)
    assert result.returncode == 0, result.stderr
    return list(yaml.safe_load_all(result.stdout))


def _rendered_kubernetes(tmp_path, config: str) -> list[dict]:
    workdir = tmp_path / "wd"
    rendered = run_in_process("render", config, "--engine-dir", str(ENGINE_70B), "--workdir", str(workdir))
    assert rendered.returncode == 0, rendered.stderr
    return _deploy_dry_run(config, workdir)


def by_kind(documents: list[dict]) -> dict[str, dict]:
    return {d["kind"]: d for d in documents}


def _flag(argv: list[str], prefix: str) -> list[str]:
    return [a[len(prefix) :] for a in argv if a.startswith(prefix)]


def repository_paths(workdir: Path) -> list[Path]:
    """Every absolute path the rendered config.pbtxt files name, except those inside the image."""
    from trtllm_forge.containers.mounts import path_parameters
    from trtllm_forge.render.values import IMAGE_PATH_PARAMETERS

    return [p.path for p in path_parameters(workdir / "render" / "model_repository") if p.key not in IMAGE_PATH_PARAMETERS]


def assert_mounted(pod: dict, paths: list[Path], claim: str | None) -> None:
    """Each path lies under a read-only mount at the same path; by PVC sub-path its own path, else a hostPath."""
    container = pod["containers"][0]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = [m for m in container["volumeMounts"] if m["mountPath"] != "/dev/shm" and m["name"] != "launcher"]
    for path in paths:
        covering = [m for m in mounts if path == Path(m["mountPath"]) or Path(m["mountPath"]) in path.parents]
        assert covering, f"{path} is not mounted"
        mount = covering[0]
        assert mount["readOnly"] is True
        volume = volumes[mount["name"]]
        if claim:
            assert volume["persistentVolumeClaim"]["claimName"] == claim
            assert mount["subPath"] == mount["mountPath"].lstrip("/")
        else:
            assert volume["hostPath"]["path"] == mount["mountPath"]
    shm = next(v for v in pod["volumes"] if v["name"] == "shm")
    assert shm["emptyDir"]["medium"] == "Memory" and re.fullmatch(r"\d+(\.\d+)?Gi", shm["emptyDir"]["sizeLimit"])
    assert {"name": "shm", "mountPath": "/dev/shm"} in container["volumeMounts"]


def assert_serving_ports(container: dict, service: dict, ranks: list[list[str]]) -> None:
    """Rank 0 listens on every interface on the container ports the probes and the Service name."""
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    for rank in ranks:
        assert _flag(rank, "--http-address=") == _flag(rank, "--grpc-address=") == ["0.0.0.0"]
    assert _flag(ranks[0], "--http-port=") == [str(ports["http"])] and _flag(ranks[0], "--grpc-port=") == [str(ports["grpc"])]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["port"] in ports
    assert container["startupProbe"]["httpGet"]["path"] == container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= set(ports)


def mpi_ranks(argv: list[str]) -> list[list[str]]:
    ranks: list[list[str]] = [[]]
    for arg in argv:
        if arg == ":":
            ranks.append([])
        else:
            ranks[-1].append(arg)
    return ranks


def test_single_node_tp4_pod_binds_every_interface_and_mounts_what_the_models_read(tmp_path):
    documents = _rendered_kubernetes(tmp_path, _config(tmp_path))
    assert [d["kind"] for d in documents] == ["PersistentVolumeClaim", "Deployment", "Service"]
    for document in documents:
        validate(document)
    docs = by_kind(documents)
    pod = docs["Deployment"]["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["image"] == NGC_26_07  # the newest NGC image that ships the engine's TensorRT-LLM, from the table
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "4"
    command = container["command"]
    assert command[:2] == ["mpirun", "--allow-run-as-root"]
    ranks = mpi_ranks(command[2:])
    assert len(ranks) == 4 and all(rank[2] == "/opt/tritonserver/bin/tritonserver" for rank in ranks)  # the image's, not this host's
    assert_serving_ports(container, docs["Service"], ranks)
    claim = docs["PersistentVolumeClaim"]["metadata"]["name"]
    workdir = tmp_path / "wd"
    read = [*repository_paths(workdir), workdir / "render" / "model_repository"]
    assert Path("/models/Llama-3.1-70B-Instruct") in read  # the tokenizer, on the serving host
    assert_mounted(pod, read, claim)
    assert docs["PersistentVolumeClaim"]["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    assert container["startupProbe"]["failureThreshold"] * container["startupProbe"]["periodSeconds"] >= 300


def test_host_path_storage_by_choice(tmp_path):
    config = _config(tmp_path, deploy={"kubernetes": {"storage": "host_path", "node_selector": {"gpu": "h200"}, "shm_gb": 8}})
    documents = _rendered_kubernetes(tmp_path, config)
    assert [d["kind"] for d in documents] == ["Deployment", "Service"]
    pod = documents[0]["spec"]["template"]["spec"]
    assert_mounted(pod, repository_paths(tmp_path / "wd"), claim=None)
    assert pod["nodeSelector"] == {"gpu": "h200"}
    assert next(v for v in pod["volumes"] if v["name"] == "shm")["emptyDir"]["sizeLimit"] == "8Gi"
    for document in documents:
        validate(document)


def _fake_tools(tmp_path: Path, phase: str = "Running") -> dict[str, str]:
    """FAKE kubectl (answers every pod's phase) and FAKE mpirun, each recording its argv one per line."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for tool, answer in (("kubectl", phase), ("mpirun", "")):
        script = bin_dir / tool
        script.write_text(
            f'#!/bin/sh\n# FAKE {tool}\nfor a in "$@"; do printf "%s\\n" "$a"; done >> "{tmp_path}/{tool}.calls"\necho ---- >> "{tmp_path}/{tool}.calls"\nprintf "{answer}"\n'
        )
        script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "LWS_LEADER_ADDRESS": "set-0.set.ns", "LWS_GROUP_SIZE": "2"}


def _lws_parts(documents: list[dict]) -> tuple[dict, dict, dict]:
    lws = by_kind(documents)["LeaderWorkerSet"]
    template = lws["spec"]["leaderWorkerTemplate"]
    return lws, template["leaderTemplate"]["spec"], template["workerTemplate"]["spec"]


def test_multi_node_leader_waits_for_its_workers_and_gives_mpirun_the_gpus_of_each_pod(tmp_path):
    """The shipped 405B config: 16 ranks on 2 pods of 8 GPUs; the leader's shell runs here against fakes."""
    workdir = tmp_path / "wd"
    documents = _deploy_dry_run(str(CONFIG_405B), workdir)
    kinds = [d["kind"] for d in documents]
    assert kinds == ["PersistentVolumeClaim", "ConfigMap", "ServiceAccount", "Role", "RoleBinding", "LeaderWorkerSet", "Service"]
    lws, leader_pod, worker_pod = _lws_parts(documents)
    with pytest.raises(kubernetes_validate.SchemaNotFoundError):
        validate(lws)  # a CRD: not among the Kubernetes schemas, hence validate_lws
    validate_lws(lws)
    for document in documents:
        if document["kind"] != "LeaderWorkerSet":
            validate(document)
    assert lws["spec"]["leaderWorkerTemplate"]["size"] == 2
    leader, worker = leader_pod["containers"][0], worker_pod["containers"][0]
    assert leader["resources"]["limits"]["nvidia.com/gpu"] == worker["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert leader["image"] == worker["image"] == FORGE_1_2_1  # ours on the NGC image: the leader's kubectl starts the ranks
    assert leader["resources"]["limits"]["rdma/ib"] == "8" and "IPC_LOCK" in leader["securityContext"]["capabilities"]["add"]
    for pod in (leader_pod, worker_pod):
        assert {"name": "NCCL_IB_HCA", "value": "mlx5"} in pod["containers"][0]["env"]
        assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
        assert_mounted(
            pod,
            [workdir.resolve(), Path("/models/Llama-3.1-405B-Instruct")],
            by_kind(documents)["PersistentVolumeClaim"]["metadata"]["name"],
        )
    assert by_kind(documents)["PersistentVolumeClaim"]["spec"]["accessModes"] == ["ReadWriteMany"]
    assert "sshd" not in " ".join(worker["command"]) and "ports" not in worker

    # The launcher: the ConfigMap's agent mounted where mpirun is told to find it, the leader's account may exec.
    config_map, role = by_kind(documents)["ConfigMap"], by_kind(documents)["Role"]
    launcher_volume = next(v for v in leader_pod["volumes"] if v["name"] == "launcher")
    assert launcher_volume["configMap"]["name"] == config_map["metadata"]["name"]
    mount_dir = next(m["mountPath"] for m in leader["volumeMounts"] if m["name"] == "launcher")
    assert (
        leader_pod["serviceAccountName"]
        == by_kind(documents)["ServiceAccount"]["metadata"]["name"]
        == by_kind(documents)["RoleBinding"]["subjects"][0]["name"]
    )
    assert {"apiGroups": [""], "resources": ["pods/exec"], "verbs": ["create"]} in role["rules"]

    script = leader["command"][2]
    assert leader["command"][:2] == ["/bin/sh", "-c"]
    env = _fake_tools(tmp_path)
    run = subprocess.run(["/bin/sh", "-c", script], env=env, capture_output=True, text=True, timeout=30)
    assert run.returncode == 0, run.stderr
    kubectl_calls = (tmp_path / "kubectl.calls").read_text().split("----\n")
    assert "set-0-1" in kubectl_calls[0].split("\n")  # waited for the worker pod by its LWS name
    mpirun = (tmp_path / "mpirun.calls").read_text().split("\n")
    assert mpirun[mpirun.index("--host") + 1] == "set-0:8,set-0-1:8"  # leader first (rank 0 serves), slots = GPUs per pod
    agent = mpirun[mpirun.index("plm_rsh_agent") + 1]
    assert Path(agent).parent == Path(mount_dir) and Path(agent).name in config_map["data"]
    ranks = mpi_ranks(mpirun[mpirun.index("--host") + 2 : mpirun.index("")])
    assert len(ranks) == 16
    assert_serving_ports(leader, by_kind(documents)["Service"], [r[2:] for r in ranks])
    assert by_kind(documents)["Service"]["spec"]["selector"] == lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["metadata"]["labels"]

    # The agent runs Open MPI's command in the named pod through the API.
    agent_file = tmp_path / "kubexec"
    agent_file.write_text(config_map["data"][Path(agent).name])
    (tmp_path / "kubectl.calls").unlink()
    subprocess.run(["/bin/sh", str(agent_file), "set-0-1", "orted", "--x"], env=env, check=True, timeout=30)
    assert (tmp_path / "kubectl.calls").read_text().split("\n")[:7] == ["exec", "set-0-1", "-c", leader["name"], "--", "/bin/sh", "-c"]


def test_multi_node_leader_gives_up_when_a_worker_never_runs(tmp_path):
    config = _config(tmp_path, CONFIG_405B, deploy={"ready_timeout_s": 1})
    _, leader_pod, _ = _lws_parts(_deploy_dry_run(config, tmp_path / "wd"))
    run = subprocess.run(
        ["/bin/sh", "-c", leader_pod["containers"][0]["command"][2]],
        env=_fake_tools(tmp_path, "Pending"),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert run.returncode == 1 and "worker pod set-0-1 is not running" in run.stderr
    assert not (tmp_path / "mpirun.calls").exists()


def test_the_schema_checks_catch_a_broken_manifest(tmp_path):
    """The validators are not vacuous: an unknown field or a wrong type fails them."""
    documents = _deploy_dry_run(str(CONFIG_405B), tmp_path / "wd")
    lws = copy.deepcopy(by_kind(documents)["LeaderWorkerSet"])
    lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]["gpus"] = 2
    with pytest.raises(kubernetes_validate.ValidationError):
        validate_lws(lws)
    lws = copy.deepcopy(by_kind(documents)["LeaderWorkerSet"])
    lws["spec"]["leaderWorkerTemplate"]["size"] = "2"
    with pytest.raises(jsonschema.ValidationError):
        validate_lws(lws)


def test_ranks_that_do_not_divide_over_the_nodes_are_refused(tmp_path):
    config = _config(tmp_path, parallel={"nodes": 3, "gpus_per_node": 2})
    workdir = tmp_path / "wd"
    assert run_in_process("render", config, "--engine-dir", str(ENGINE_70B), "--workdir", str(workdir)).returncode == 0
    result = run_in_process("deploy", config, "--workdir", str(workdir), "--target", "kubernetes", "--dry-run")
    assert result.returncode == 2 and "parallel.nodes: tp x pp = 4 ranks cannot be spread evenly over 3 nodes" in result.stderr


def _llmapi(tmp_path, source: Path, **deploy) -> str:
    data = yaml.safe_load(source.read_text())
    data["engine"]["target"] = "llmapi"
    data["deploy"] = {**data.get("deploy", {}), "server": "trtllm-serve", **deploy}
    data.pop("quantization", None)
    path = tmp_path / f"{data['name']}-llmapi.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def test_trtllm_serve_dry_run_prints_the_manifest_before_the_build(tmp_path):
    workdir = tmp_path / "wd"
    documents = _deploy_dry_run(_llmapi(tmp_path, REPO / "configs" / "llama3.1-70b-fp8-h200-tp4.yaml"), workdir)
    assert [d["kind"] for d in documents] == ["PersistentVolumeClaim", "Deployment", "Service"]
    for document in documents:
        validate(document)
    pod = by_kind(documents)["Deployment"]["spec"]["template"]["spec"]
    container = pod["containers"][0]
    argv = container["command"]
    assert argv[:2] == ["trtllm-serve", "/models/Llama-3.1-70B-Instruct"]
    assert argv[argv.index("--host") + 1] == "0.0.0.0" and argv[argv.index("--port") + 1] == str(container["ports"][0]["containerPort"])
    options = Path(argv[argv.index("--config") + 1])  # trtllm-serve's 1.3 spelling of --extra_llm_api_options
    assert options == workdir.resolve() / "build" / "llmapi" / "extra_llm_api_options.yaml"  # where the build writes it
    assert_mounted(pod, [Path(argv[1]), options], by_kind(documents)["PersistentVolumeClaim"]["metadata"]["name"])
    assert container["startupProbe"]["httpGet"]["path"] == container["readinessProbe"]["httpGet"]["path"] == "/health"


def test_trtllm_serve_on_two_nodes_runs_nvidias_llmapi_launch_under_mpirun(tmp_path):
    documents = _deploy_dry_run(_llmapi(tmp_path, CONFIG_405B), tmp_path / "wd")
    lws, leader_pod, worker_pod = _lws_parts(documents)
    validate_lws(lws)
    script = leader_pod["containers"][0]["command"][2]
    run = subprocess.run(["/bin/sh", "-c", script], env=_fake_tools(tmp_path), capture_output=True, text=True, timeout=30)
    assert run.returncode == 0, run.stderr
    mpirun = (tmp_path / "mpirun.calls").read_text().split("\n")
    assert mpirun[mpirun.index("--host") + 1] == "set-0:8,set-0-1:8"
    rest = mpirun[mpirun.index("--host") + 2 :]
    assert rest[:4] == ["-np", "16", "trtllm-llmapi-launch", "trtllm-serve"]
    assert rest[rest.index("--tp_size") + 1] == "16" and rest[rest.index("--host") + 1] == "0.0.0.0"
    assert worker_pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "8"


def test_a_repository_rendered_for_this_host_is_refused_in_a_pod(tmp_path):
    """deploy.target local points the python models at this host's venv (EXECUTION_ENV_PATH): never in a pod."""
    config = REPO / "configs" / "smollm2-cpu.yaml"
    workdir = tmp_path / "wd"
    rendered = run_in_process("render", str(config), "--engine-dir", str(ENGINES / "smollm2-cpu"), "--workdir", str(workdir))
    assert rendered.returncode == 0, rendered.stderr
    result = run_in_process("deploy", str(config), "--workdir", str(workdir), "--target", "kubernetes", "--dry-run")
    assert result.returncode == 2
    assert "parameter EXECUTION_ENV_PATH" in result.stderr and "this host's Python environment" in result.stderr


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


def test_the_cpu_manifest_names_the_content_hash_tag_make_image_builds(tmp_path):
    """A CPU config's Kubernetes pods run the image `make image` builds (containers/image.py: one tag function, the
    content hash of base, Containerfile, wheelhouse and source), never a floating `latest`."""
    from trtllm_forge.config import load_config
    from trtllm_forge.containers.image import IMAGE_NAME, cpu_image_tag, plan_image
    from trtllm_forge.deploy.targets import kubernetes_documents

    config = load_config(REPO / "configs" / "smollm2-cpu.yaml")
    (tmp_path / "repo").mkdir()
    documents = kubernetes_documents(config, tmp_path, tmp_path / "repo")
    pods = [doc["spec"]["template"]["spec"] for doc in documents if doc["kind"] == "Deployment"]
    images = {container["image"] for pod in pods for container in pod["containers"]}
    tag = cpu_image_tag()
    assert images == {tag} and tag == plan_image().tag
    assert re.fullmatch(re.escape(IMAGE_NAME) + r":[0-9a-f]{16}", tag), tag
