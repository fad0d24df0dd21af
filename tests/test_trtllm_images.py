"""The serving-image fact table (spec/serving-images.json) and what is built on it: the one image that builds and
serves, the engine ↔ image TensorRT-LLM version refusal in render and deploy, and the driver check (nvidia-smi
output parsed in the formats real drivers print; there is no GPU here)."""

from __future__ import annotations

import json
import os
import re
import shutil

import pytest
import yaml
from cli_inprocess import run_in_process
from trtllm_forge.builders.tensorrt_llm import images
from trtllm_forge.builders.tensorrt_llm.spec import load_spec
from trtllm_helpers import REPO

from trtllm_forge.errors import ConfigError

ENGINES = REPO / "tests" / "fixtures" / "engines"
NGC_25_12 = "nvcr.io/nvidia/tritonserver:25.12-trtllm-python-py3"
NGC_26_07 = "nvcr.io/nvidia/tritonserver:26.07-trtllm-python-py3"
FORGE_1_2_1 = "trtllm-forge:0.1.0-trtllm1.2.1"
MATRIX_COLUMNS = ("tensorrt_llm", "tensorrt", "cuda", "min_driver", "python", "torch", "triton")


def test_every_row_names_its_source():
    table = images.matrix()
    for row in table["images"]:
        source = table["sources"][row["source"]]
        assert source["repo"] and source["path"] and re.fullmatch(r"[0-9a-f]{40}", source["commit"]), row
        assert re.fullmatch(r"nvcr\.io/nvidia/tritonserver:(\d\d\.\d\d)-trtllm-python-py3", row["image"]).group(1) == row["triton"]
        assert all(row[k] for k in MATRIX_COLUMNS), row
    for route in table["routes"].values():
        assert all(key in table["sources"] for key in route["source"])


def test_no_route_for_a_version_an_ngc_image_ships():
    """The Dockerfile route is only for versions no NGC image ships."""
    shipped = {row.tensorrt_llm for row in images.ngc_images()}
    assert not shipped & set(images.matrix()["routes"])


def test_the_newest_ngc_image_that_ships_a_version_serves_it():
    """NVIDIA's Triton compatibility matrix: 26.04-26.07 ship TensorRT-LLM 1.2.1, 26.03 ships 1.2.0, 25.12 ships 1.1.0."""
    assert images.describe_image(NGC_25_12).tensorrt_llm == "1.1.0"
    rows = images.ngc_images()
    assert [r.triton for r in rows] == sorted((r.triton for r in rows), key=lambda t: tuple(map(int, t.split("."))), reverse=True)
    for version in ("1.2.1", "1.2.0", "1.1.0"):
        chosen = images.image_for_version(version)
        newest = max((r for r in rows if r.tensorrt_llm == version), key=lambda r: tuple(map(int, r.triton.split("."))))
        assert chosen == newest and chosen.how == "ngc" and chosen.base_image is None
    assert images.image_for_version("1.2.1").image == NGC_26_07
    # every version the engine path's spec accepts has an NGC image today
    for version in load_spec().compatible_versions:
        assert images.image_for_version(version).how == "ngc"
    with pytest.raises(ConfigError, match=re.escape("no serving image is known for TensorRT-LLM 1.3.0rc29")):
        images.image_for_version("1.3.0rc29")


def test_our_build_image_is_the_dockerfile_on_that_ngc_image():
    """build-engine runs in our image (trtllm-forge inside) on the NGC image, with its TensorRT-LLM and TensorRT, so the
    NGC image serves what it built; the Dockerfile's default base is that image."""
    served, built = images.image_for_version("1.2.1"), images.build_image_for_version("1.2.1")
    assert built.image == FORGE_1_2_1 and built.how == "forge-on-ngc" and built.base_image == NGC_26_07
    assert (built.tensorrt_llm, built.tensorrt, built.cuda, built.min_driver) == (
        served.tensorrt_llm,
        served.tensorrt,
        served.cuda,
        served.min_driver,
    )
    assert images.describe_image(FORGE_1_2_1) == built
    spec = load_spec("1.2.1")
    assert spec.container_image == FORGE_1_2_1 and spec.base_image == NGC_26_07
    dockerfile = (REPO / "docker" / "Dockerfile").read_text()
    assert re.search(r"^ARG BASE_IMAGE=(\S+)$", dockerfile, re.M).group(1) == NGC_26_07
    # a single-node deployment is served by the NGC image; a multi-node one needs ours (kubectl)
    assert images.serving_image(None, "1.2.1") == NGC_26_07
    assert images.serving_image(None, "1.2.1", multi_node=True) == FORGE_1_2_1
    assert images.serving_image("registry.example.com/mine:1", "1.2.1") == "registry.example.com/mine:1"


def test_mismatch_line_names_both_versions_and_the_image_to_use():
    with pytest.raises(ConfigError) as caught:
        images.check_engine_image("1.2.1", NGC_25_12)
    line = caught.value.format_message()
    assert "\n" not in line
    assert "TensorRT-LLM 1.2.1" in line and "TensorRT-LLM 1.1.0" in line and f"serve it with {NGC_26_07}" in line
    # an engine built in 25.12 is served by the newest image with its version (1.1.0: 26.02)
    with pytest.raises(ConfigError, match=re.escape("serve it with nvcr.io/nvidia/tritonserver:26.02-trtllm-python-py3")):
        images.check_engine_image("1.1.0", NGC_26_07)
    with pytest.raises(ConfigError, match=re.escape("ships TensorRT-LLM 1.2.1")):
        images.check_engine_image("1.2.0", FORGE_1_2_1)
    images.check_engine_image("1.2.1", NGC_26_07)
    images.check_engine_image("1.2.1", FORGE_1_2_1)
    images.check_engine_image("1.2.1", "nvcr.io/nvidia/tritonserver:26.04-trtllm-python-py3")
    assert images.version_mismatch("1.2.1", "registry.example.com/my-own-triton:1") is None  # unknown image: not judged


def _engine_with_version(tmp_path, name: str, version: str):
    engine = tmp_path / "engine"
    shutil.copytree(ENGINES / name, engine)
    config = json.loads((engine / "config.json").read_text())
    config["version"] = version
    (engine / "config.json").write_text(json.dumps(config))
    return engine


def _config_with(tmp_path, source: str, **deploy) -> str:
    data = yaml.safe_load((REPO / "configs" / source).read_text())
    data.setdefault("deploy", {}).update(deploy)
    path = tmp_path / source
    path.write_text(yaml.safe_dump(data))
    return str(path)


def _one_error(result) -> str:
    assert result.returncode == 2, result.stdout + result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in result.stderr, result.stderr
    return errors[0]


def test_render_refuses_a_1_2_1_engine_for_the_25_12_image(tmp_path):
    config = _config_with(tmp_path, "mistral-7b-int4awq-a10g.yaml", image=NGC_25_12)
    result = run_in_process("render", config, "--engine-dir", str(ENGINES / "mistral-7b-int4awq-a10g"), "--workdir", str(tmp_path / "wd"))
    line = _one_error(result)
    assert "deploy.image" in line and "1.2.1" in line and "1.1.0" in line and NGC_26_07 in line
    assert not (tmp_path / "wd" / "render").exists()


def test_render_refuses_an_engine_from_another_version_with_the_default_image(tmp_path):
    engine = _engine_with_version(tmp_path, "mistral-7b-int4awq-a10g", "1.1.0")
    config = _config_with(tmp_path, "mistral-7b-int4awq-a10g.yaml")
    line = _one_error(run_in_process("render", config, "--engine-dir", str(engine), "--workdir", str(tmp_path / "wd")))
    assert f"{NGC_26_07} ships TensorRT-LLM 1.2.1" in line and "serve it with nvcr.io/nvidia/tritonserver:26.02-trtllm-python-py3" in line


def test_deploy_docker_refuses_the_rendered_engine_in_an_image_of_another_version(tmp_path):
    config = _config_with(tmp_path, "mistral-7b-int4awq-a10g.yaml")
    workdir = tmp_path / "wd"
    rendered = run_in_process("render", config, "--engine-dir", str(ENGINES / "mistral-7b-int4awq-a10g"), "--workdir", str(workdir))
    assert rendered.returncode == 0, rendered.stderr
    ok = run_in_process("deploy", config, "--workdir", str(workdir), "--target", "docker", "--dry-run")
    assert ok.returncode == 0, ok.stderr
    assert f":ro {NGC_26_07} tritonserver" in ok.stdout
    wrong = _config_with(tmp_path, "mistral-7b-int4awq-a10g.yaml", image=NGC_25_12)
    line = _one_error(run_in_process("deploy", wrong, "--workdir", str(workdir), "--target", "docker", "--dry-run"))
    assert "1.2.1" in line and "1.1.0" in line and NGC_26_07 in line


def test_deploy_docker_checks_this_hosts_driver_against_the_image_minimum(tmp_path):
    """A FAKE nvidia-smi (there is no GPU here) reporting an R580 driver: the 1.2.1 image (CUDA 13.1) needs 590.44.01."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "nvidia-smi"
    fake.write_text("#!/bin/sh\n# FAKE nvidia-smi for this test\necho 580.95.05\n")
    fake.chmod(0o755)
    config = _config_with(tmp_path, "mistral-7b-int4awq-a10g.yaml")
    workdir = tmp_path / "wd"
    assert (
        run_in_process("render", config, "--engine-dir", str(ENGINES / "mistral-7b-int4awq-a10g"), "--workdir", str(workdir)).returncode
        == 0
    )
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    line = _one_error(run_in_process("deploy", config, "--workdir", str(workdir), "--target", "docker", "--dry-run", env=env))
    assert "NVIDIA driver 580.95.05 is older than 590.44.01" in line and NGC_26_07 in line


# nvidia-smi output as drivers print it (R580 and R535 default tables, -q, and the CSV query forms).
SMI_R580 = """Tue Dec  1 10:12:01 2026
+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI 580.95.05              Driver Version: 580.95.05      CUDA Version: 13.0     |
|-----------------------------------------+------------------------+----------------------+
| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |
|   0  NVIDIA H100 80GB HBM3          On  |   00000000:18:00.0 Off |                    0 |
+-----------------------------------------+------------------------+----------------------+
"""
SMI_R535 = """+---------------------------------------------------------------------------------------+
| NVIDIA-SMI 535.129.03             Driver Version: 535.129.03   CUDA Version: 12.2     |
|-----------------------------------------+----------------------+----------------------+
"""
SMI_Q = """==============NVSMI LOG==============

Timestamp                                 : Tue Dec  1 10:12:01 2026
Driver Version                            : 575.57.08
CUDA Version                              : 12.9

Attached GPUs                             : 1
"""


@pytest.mark.parametrize(
    "text, version",
    [
        (SMI_R580, "580.95.05"),
        (SMI_R535, "535.129.03"),
        (SMI_Q, "575.57.08"),
        ("580.95.05\n580.95.05\n", "580.95.05"),
        ("driver_version\n570.86.10\n", "570.86.10"),
        ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n", None),
        ("No devices were found\n", None),
    ],
)
def test_driver_version_parsing(text, version):
    assert images.parse_driver_version(text) == version


def test_driver_against_the_image_minimum():
    image = images.image_for_version("1.2.1")
    assert image.min_driver == "590.44.01"  # the matrix's 26.07 row (CUDA 13.1.0.036)
    assert images.driver_problem("590.44.01", image) is None and images.driver_problem("595.10", image) is None
    problem = images.driver_problem("580.95.05", image)
    assert "580.95.05 is older than 590.44.01" in problem and NGC_26_07 in problem
    assert images.driver_problem("590.9.1", image)  # compared numerically per part, not as text


def test_plan_doctor_and_build_engine_say_the_engine_path_is_the_legacy_line():
    """One sentence, defined once (images.LEGACY_ENGINE_PATH), in each command's own output."""
    config = str(REPO / "configs" / "qwen2.5-7b-fp16-l40s-tp2.yaml")
    sentence = images.LEGACY_ENGINE_PATH
    assert "1.2.x" in sentence and "engine.target: llmapi" in sentence
    dry = run_in_process("build-engine", config, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert " ".join(dry.stderr.split()).count(sentence) == 1
    planned = run_in_process("plan", config, "--json")
    assert planned.returncode == 0, planned.stderr
    assert json.loads(planned.stdout)["engine_path"] == sentence
    text = run_in_process("plan", config)
    assert " ".join((text.stdout + text.stderr).split()).count(sentence) == 1
    doctor = run_in_process("doctor", "--json")
    rows = {c["name"]: c for c in json.loads(doctor.stdout)["checks"]}
    assert sentence in rows["TensorRT-LLM"]["needed_for"]
    # a CPU config's plan does not say it
    cpu = run_in_process("plan", str(REPO / "configs" / "smollm2-cpu.yaml"), "--json")
    assert cpu.returncode == 0 and json.loads(cpu.stdout)["engine_path"] is None
