"""`trtllm-serve` as a deploy kind: the exact 1.2 command for local, docker and Kubernetes renderings, and on CPU
the LLM-API stand-in behind the same argv, served for real and measured by our bench's OpenAI target."""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path

import pytest
import yaml
from conftest import CONFIGS, cpu_test_config

from trtllm_forge.config import load_config
from trtllm_forge.deploy import trtllm_serve
from trtllm_forge.llmapi_args import table_of

GPU_LLMAPI = CONFIGS / "llama3.1-8b-fp8-h100.yaml"


def test_gpu_command_is_trtllm_serve_with_the_options_file():
    config = load_config(GPU_LLMAPI)
    assert config.engine.target == "llmapi"
    argv = trtllm_serve.serve_argv(config, "/models/llama", "/wd/build/llmapi/extra_llm_api_options.yaml")
    assert argv[:4] == ["trtllm-serve", "/models/llama", "--backend", "pytorch"]
    flags = dict(zip(argv[2::2], argv[3::2], strict=False))
    assert flags["--tp_size"] == str(config.parallel.tp) and flags["--pp_size"] == str(config.parallel.pp)
    assert flags["--extra_llm_api_options"] == "/wd/build/llmapi/extra_llm_api_options.yaml"
    assert flags["--host"] == config.triton.bind_address


def test_docker_and_kubernetes_run_the_same_command():
    config = load_config(GPU_LLMAPI)
    inside = trtllm_serve.serve_argv(config, "/models/llama", "/wd/opts/extra.yaml", host="0.0.0.0", port=8000)
    docker = trtllm_serve.docker_argv(config, "/models/llama", "/wd/opts/extra.yaml")
    image = trtllm_serve.image_for(config)
    assert (
        docker[:2] == ["docker", "run"] and "--gpus" in docker and "tensorrt-llm/release:" in image
    )  # NVIDIA's release image carries trtllm-serve
    assert docker[docker.index(image) + 1 :] == inside
    assert "/models/llama:/models/llama:ro" in docker
    claim, deployment, service = yaml.safe_load_all(trtllm_serve.kubernetes_manifest(config, "/models/llama", "/wd/opts/extra.yaml"))
    assert claim["kind"] == "PersistentVolumeClaim"
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == inside and container["image"] == image
    assert container["readinessProbe"]["httpGet"]["path"] == "/health"
    assert container["resources"]["limits"]["nvidia.com/gpu"] == str(config.parallel.world_size)
    assert service["spec"]["ports"][0]["port"] == 8000


def test_cpu_command_is_the_stand_in_with_trtllm_serves_flags():
    config = cpu_test_config(engine={"target": "llmapi"})
    argv = trtllm_serve.serve_argv(config, "/wd/build/engine", "/wd/opts.yaml", host="127.0.0.1", port=9)
    assert argv[1:3] == ["-m", trtllm_serve.STAND_IN_MODULE]
    gpu_shape = trtllm_serve.serve_argv(load_config(GPU_LLMAPI), "/wd/build/engine", "/wd/opts.yaml")
    assert [a for a in argv[3:] if a.startswith("--")] == [a for a in gpu_shape[1:] if a.startswith("--")]


@pytest.fixture(scope="module")
def deployed(cpu_engine_llmapi, tmp_path_factory):
    """(what `deploy start --json` described, workdir, config file): the deploy kind through the CLI, `deploy start`
    of smollm2-cpu-llmapi.yaml with deploy.server trtllm-serve on the session's llmapi build (its engine and
    build/llmapi/model.yaml), i.e. the stand-in behind trtllm-serve's argv. One server for the module's endpoint, bench
    and deploy tests; test_deploy_stop_ends_the_stand_in, the last of them, stops it."""
    from chain_helpers import link_stages
    from conftest import run_cli

    root = tmp_path_factory.mktemp("trtllm-serve")
    source = yaml.safe_load((CONFIGS / "smollm2-cpu-llmapi.yaml").read_text())
    source["deploy"]["server"] = "trtllm-serve"
    source["bench"]["workloads"][0]["target"] = "openai"  # trtllm-serve speaks OpenAI only (a config rule)
    config_file = root / "serve.yaml"
    config_file.write_text(yaml.safe_dump(source))
    workdir = root / "wd"
    link_stages(workdir, cpu_engine_llmapi[0] / "build")
    started = run_cli("deploy", "start", str(config_file), "--workdir", str(workdir), "--json", timeout=600)
    assert started.returncode == 0, started.stderr[-3000:]
    try:
        yield json.loads(started.stdout), workdir, config_file
    finally:
        run_cli("deploy", "stop", "--workdir", str(workdir))


def _post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())


@pytest.mark.slow
def test_deploy_start_runs_the_stand_in_with_trtllm_serves_argv(deployed):
    described, workdir, _ = deployed
    options_flag = table_of(None, "trtllm-serve").serve_options_flag  # trtllm-serve's default version's spelling
    assert described["stand_in"] is True and options_flag in described["argv"]
    assert described["argv"][1:3] == ["-m", trtllm_serve.STAND_IN_MODULE]
    with urllib.request.urlopen(f"{described['url']}/health") as response:
        assert response.status == 200
    assert trtllm_serve.served_url(workdir) == described["url"]
    # The stand-in's engine committed its KV cache pool at load, as the CPU engine model does (kv_pool.py).
    committed = re.search(r"warm-up of \d+ requests \d+ ms; committed (\d+) MiB", (workdir / "logs" / "trtllm-serve.log").read_text())
    assert committed and int(committed.group(1)) > 0


@pytest.mark.slow
def test_deploy_status_reports_the_running_trtllm_serve(deployed):
    """`deploy status` reads trtllm-serve's record too (it once read only Triton's state.json and said "not
    running"): its process alive and ready, its URL, exit 0."""
    from conftest import run_cli

    described, workdir, _ = deployed
    status = run_cli("deploy", "status", "--workdir", str(workdir), "--json")
    assert status.returncode == 0, status.stderr
    document = json.loads(status.stdout)
    assert document["server"] == "trtllm-serve" and document["running"] is True and document["speaks"] == "openai"
    assert [(p["pid"], p["alive"], p["ready"]) for p in document["processes"]] == [(described["pid"], True, True)]
    human = run_cli("deploy", "status", "--workdir", str(workdir))
    assert human.returncode == 0 and human.stderr.lstrip().startswith("running") and described["url"] in human.stderr


@pytest.mark.slow
def test_stand_in_serves_openai_endpoints(deployed):
    described, workdir, _ = deployed
    url, model = described["url"], trtllm_serve.served_model(workdir)
    with urllib.request.urlopen(f"{url}/v1/models") as response:
        assert json.loads(response.read())["data"][0]["id"] == model
    done = _post(f"{url}/v1/completions", {"model": model, "prompt": "The capital of France is", "max_tokens": 8})
    assert done["choices"][0]["text"].startswith(" Paris") and done["usage"]["completion_tokens"] == 8
    chat = _post(f"{url}/v1/chat/completions", {"model": model, "messages": [{"role": "user", "content": "Say hello"}], "max_tokens": 8})
    assert chat["choices"][0]["message"]["content"]
    with urllib.request.urlopen(f"{url}/metrics") as response:
        assert json.loads(response.read())[0]["finished"] >= 2


@pytest.mark.slow
def test_bench_openai_target_measures_the_stand_in(deployed, smollm2_checkpoint):
    from trtllm_forge.bench.run import BenchOptions, run_bench
    from trtllm_forge.bench.specs import LengthSpec

    described, workdir, _ = deployed
    for endpoint in ("completions", "chat"):
        options = BenchOptions(
            target="openai",
            url=described["url"],
            model=str(trtllm_serve.served_model(workdir)),
            concurrency=[2],
            num_requests=4,
            warmup_requests=1,
            input_len=LengthSpec(32),
            output_len=LengthSpec(12),
            tokenizer=smollm2_checkpoint,
            out=workdir.parent / f"bench-{endpoint}",
            plots=False,
            openai_endpoint=endpoint,
        )
        document = run_bench(options)
        point = (document.get("points") or [document])[0]
        assert point["requests"]["completed"] == 4 and point["requests"]["failed"] == 0, point["requests"]
        assert point["metrics"]["output_token_throughput_per_s"]["avg"] > 0


@pytest.mark.slow
def test_bench_cli_finds_the_workdirs_trtllm_serve(deployed):
    from conftest import run_cli

    _, workdir, config_file = deployed
    bench = run_cli(
        "bench",
        str(config_file),
        "--workdir",
        str(workdir),
        "--target",
        "openai",
        "--concurrency",
        "1",
        "--num-requests",
        "2",
        "--warmup",
        "0",
        "--input-len",
        "16",
        "--output-len",
        "8",
        "--json",
        timeout=600,
    )
    assert bench.returncode == 0, bench.stderr[-3000:]
    point = (json.loads(bench.stdout).get("points") or [json.loads(bench.stdout)])[0]
    assert point["requests"]["completed"] == 2 and point["requests"]["failed"] == 0


@pytest.mark.slow
def test_deploy_stop_ends_the_stand_in(deployed):
    """The last test on the module's server: `deploy stop` ends it (and `deploy start --target docker` renders it)."""
    from conftest import run_cli

    described, workdir, config_file = deployed
    stopped = run_cli("deploy", "stop", "--workdir", str(workdir))
    assert stopped.returncode == 0, stopped.stderr
    with pytest.raises(OSError):
        urllib.request.urlopen(f"{described['url']}/health", timeout=2)
    assert not (workdir / "deploy" / trtllm_serve.STATE).exists()
    status = run_cli("deploy", "status", "--workdir", str(workdir), "--json")
    assert status.returncode == 3 and json.loads(status.stdout)["running"] is False, status.stderr
    docker = run_cli("deploy", "start", str(config_file), "--workdir", str(workdir), "--target", "docker", "--json")
    assert docker.returncode == 0, docker.stderr
    assert "trtllm_forge.llmapi_cpu.serve" in Path(json.loads(docker.stdout)["file"]).read_text()


def _serve_config(tmp_path: Path, **workload) -> Path:
    source = yaml.safe_load((CONFIGS / "smollm2-cpu-llmapi.yaml").read_text())
    source["deploy"]["server"] = "trtllm-serve"
    source["verify"] = {"prompts": ["The capital of France is"], "max_tokens": 20}  # answered from the session's reference cache
    source["bench"]["workloads"] = [
        {"name": "openai-short", "concurrency": [2], "num_requests": 4, "warmup_requests": 1, "input_len": 16, "output_len": 8, **workload}
    ]
    config_file = tmp_path / "serve.yaml"
    config_file.write_text(yaml.safe_dump(source))
    return config_file


def test_bench_on_trtllm_serve_must_target_openai(tmp_path):
    from conftest import run_cli

    config_file = _serve_config(tmp_path, target="triton-grpc")
    proc = run_cli("config", "validate", str(config_file))
    assert proc.returncode == 2
    assert "bench.workloads[0].target" in proc.stderr and "set target: openai" in proc.stderr


@pytest.mark.slow
def test_run_with_trtllm_serve_smokes_verifies_and_benches_its_openai_endpoint(
    imported_smollm2, cpu_engine_llmapi, chain_host_profile, tmp_path
):
    """`run` on deploy.server trtllm-serve: deploy starts the (stand-in) trtllm-serve, smoke and verify ask its
    /v1/completions (exact tokens against transformers in fp32), bench measures it with the openai target, and
    the server is gone afterwards. The import and the llmapi build are the session's (its engine section is
    smollm2-cpu-llmapi.yaml's)."""
    from chain_helpers import reused_workdir, run_chain

    config_file = _serve_config(tmp_path)  # the workload's target is left unset: openai for trtllm-serve
    workdir = reused_workdir(tmp_path, imported_smollm2.parent, cpu_engine_llmapi[0] / "build")
    proc = run_chain(workdir, config_file, host_profile=chain_host_profile)
    assert proc.returncode == 0, proc.stderr[-4000:]
    doc = json.loads(proc.stdout)
    stages = {s["name"]: s for s in doc["stages"]}
    assert [(s["name"], s["status"]) for s in doc["stages"]][:3] == [("import", "skipped"), ("build", "skipped"), ("render", "done")]
    assert all(s["status"] == "done" for s in doc["stages"][3:]), doc["stages"]
    assert "grpc none" in stages["deploy"]["detail"] and "http://127.0.0.1:" in stages["deploy"]["detail"]
    assert "Paris" in doc["answer"] and doc["stream_matches"] is True
    assert doc["verify"]["passed"] and doc["verify"]["agreement"]["prefix"] == 1.0
    workload = doc["bench"]["workloads"][0]
    (point,) = workload.get("points") or [workload]  # one sweep point: the summary itself
    assert point["target"]["kind"] == "openai" and point["requests"]["completed"] == 4 and point["requests"]["failed"] == 0
    log = (workdir / "logs" / "trtllm-serve.log").read_text()
    options_flag = table_of(None, "trtllm-serve").serve_options_flag
    assert "trtllm_forge.llmapi_cpu.serve" in log.splitlines()[0] and options_flag in log.splitlines()[0]
    assert not (workdir / "deploy" / trtllm_serve.STATE).exists()  # stopped and its record removed
    assert not (workdir / "deploy" / "state.json").exists()  # no Triton was started


def test_trtllm_serve_runs_in_nvidias_release_image_of_its_llmapi_version():
    """The rendered flags are one LLM-API version's spellings: the image must carry that version (the release image),
    and a multi-node leader our Dockerfile on that same release image (kubectl)."""
    from trtllm_forge.builders.tensorrt_llm.container import llmapi_leader_build_argv
    from trtllm_forge.builders.tensorrt_llm.images import forge_image_tag, release_image

    from trtllm_forge.llmapi_args import TABLES

    for version in TABLES:
        config = cpu_test_config(engine={"target": "llmapi", "llmapi_version": version}, hardware={"gpu": "h100-sxm"})
        assert trtllm_serve.image_for(config) == release_image(version).image
        assert version in trtllm_serve.image_for(config)
        two_nodes = config.model_copy(update={"parallel": config.parallel.model_copy(update={"nodes": 2})})
        assert trtllm_serve.image_for(two_nodes) == forge_image_tag(version)
        build = llmapi_leader_build_argv(version)
        assert f"BASE_IMAGE={release_image(version).image}" in build and build[build.index("-t") + 1] == forge_image_tag(version)
    pinned = cpu_test_config(engine={"target": "llmapi"}, deploy={"image": "registry.example/mine:1"})
    assert trtllm_serve.image_for(pinned) == "registry.example/mine:1"


def test_a_multi_node_rendering_names_the_leader_image_and_its_build(tmp_path):
    """Several nodes: every pod runs our image on NVIDIA's release image (kubectl in the leader); the render's note
    gives the `docker build` that makes it, so the manifest does not name an image nobody built."""
    from trtllm_forge.builders.tensorrt_llm.container import llmapi_leader_build_argv

    from trtllm_forge.deploy.kinds import kind_of

    config = load_config(CONFIGS / "llama3.1-405b-bf16-h100x16-2node.yaml")
    config = config.model_copy(
        update={
            "deploy": config.deploy.model_copy(update={"server": "trtllm-serve"}),
            "engine": config.engine.model_copy(update={"target": "llmapi"}),
        }
    )
    assert config.parallel.nodes > 1
    rendering = kind_of(config).render(config, tmp_path, tmp_path / "repository", "kubernetes")
    version = trtllm_serve.served_llmapi_version(config)
    assert " ".join(llmapi_leader_build_argv(version)) in rendering.note
    assert f"image: {trtllm_serve.image_for(config)}" in rendering.text
