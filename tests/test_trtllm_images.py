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
FORGE_1_2_1 = "trtllm-forge:0.1.0-trtllm1.2.1"


def test_every_row_names_its_source():
    table = images.matrix()
    for row in table["images"]:
        source = table["sources"][row["source"]]
        assert source.get("url") or (source.get("repo") and source.get("path")), row
        assert re.fullmatch(r"nvcr\.io/nvidia/tritonserver:\d\d\.\d\d-trtllm-python-py3", row["image"])
        assert all(row[k] for k in ("tensorrt_llm", "tensorrt", "cuda", "min_driver"))
    for route in table["routes"].values():
        assert all(key in table["sources"] for key in route["source"])


def test_25_12_ships_1_1_0_and_no_ngc_image_ships_1_2():
    """NVIDIA's Triton compatibility matrix: 25.12-trtllm-python-py3 carries TensorRT-LLM 1.1.0 (not 1.2.1)."""
    assert images.describe_image(NGC_25_12).tensorrt_llm == "1.1.0"
    assert not [row for row in images.ngc_images() if row.tensorrt_llm.startswith("1.2")]
    chosen = images.image_for_version("1.2.1")
    assert chosen.image == FORGE_1_2_1 and chosen.how == "pinned-install" and chosen.base_image == NGC_25_12
    # ...with the TensorRT and CUDA of its base image (what 1.2.x's requirements ask for)
    assert chosen.tensorrt.startswith("10.13.3") and images.describe_image(NGC_25_12).tensorrt.startswith(chosen.tensorrt)
    # one image builds and serves: the spec, the build container and the Dockerfile all name it
    spec = load_spec("1.2.1")
    assert spec.container_image == FORGE_1_2_1 and spec.base_image == NGC_25_12
    dockerfile = (REPO / "docker" / "Dockerfile").read_text()
    assert re.search(r"^ARG BASE_IMAGE=(\S+)$", dockerfile, re.M).group(1) == NGC_25_12


def test_mismatch_line_names_both_versions_and_the_image_to_use():
    with pytest.raises(ConfigError) as caught:
        images.check_engine_image("1.2.1", NGC_25_12)
    line = caught.value.format_message()
    assert "\n" not in line
    assert "TensorRT-LLM 1.2.1" in line and "TensorRT-LLM 1.1.0" in line and f"serve it with {FORGE_1_2_1}" in line
    # an engine built in the NGC image is served by that image
    with pytest.raises(ConfigError, match=f"serve it with {re.escape(NGC_25_12)}"):
        images.check_engine_image("1.1.0", FORGE_1_2_1)
    images.check_engine_image("1.2.1", FORGE_1_2_1)
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
    assert "deploy.image" in line and "1.2.1" in line and "1.1.0" in line and FORGE_1_2_1 in line
    assert not (tmp_path / "wd" / "render").exists()


def test_render_refuses_an_engine_from_another_version_with_the_default_image(tmp_path):
    engine = _engine_with_version(tmp_path, "mistral-7b-int4awq-a10g", "1.1.0")
    config = _config_with(tmp_path, "mistral-7b-int4awq-a10g.yaml")
    line = _one_error(run_in_process("render", config, "--engine-dir", str(engine), "--workdir", str(tmp_path / "wd")))
    assert f"{FORGE_1_2_1} ships TensorRT-LLM 1.2.1" in line and f"serve it with {NGC_25_12}" in line


def test_deploy_docker_refuses_the_rendered_engine_in_an_image_of_another_version(tmp_path):
    config = _config_with(tmp_path, "mistral-7b-int4awq-a10g.yaml")
    workdir = tmp_path / "wd"
    rendered = run_in_process("render", config, "--engine-dir", str(ENGINES / "mistral-7b-int4awq-a10g"), "--workdir", str(workdir))
    assert rendered.returncode == 0, rendered.stderr
    ok = run_in_process("deploy", config, "--workdir", str(workdir), "--target", "docker", "--dry-run")
    assert ok.returncode == 0, ok.stderr
    assert f":ro {FORGE_1_2_1} tritonserver" in ok.stdout
    wrong = _config_with(tmp_path, "mistral-7b-int4awq-a10g.yaml", image=NGC_25_12)
    line = _one_error(run_in_process("deploy", wrong, "--workdir", str(workdir), "--target", "docker", "--dry-run"))
    assert "1.2.1" in line and "1.1.0" in line and FORGE_1_2_1 in line


def test_deploy_docker_checks_this_hosts_driver_against_the_image_minimum(tmp_path):
    """A FAKE nvidia-smi (there is no GPU here) reporting an R575 driver: the 1.2.1 image needs 580.95.05."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "nvidia-smi"
    fake.write_text("#!/bin/sh\n# FAKE nvidia-smi for this test\necho 575.57.08\n")
    fake.chmod(0o755)
    config = _config_with(tmp_path, "mistral-7b-int4awq-a10g.yaml")
    workdir = tmp_path / "wd"
    assert (
        run_in_process("render", config, "--engine-dir", str(ENGINES / "mistral-7b-int4awq-a10g"), "--workdir", str(workdir)).returncode
        == 0
    )
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    line = _one_error(run_in_process("deploy", config, "--workdir", str(workdir), "--target", "docker", "--dry-run", env=env))
    assert "NVIDIA driver 575.57.08 is older than 580.95.05" in line and FORGE_1_2_1 in line


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
    assert images.driver_problem("580.95.05", image) is None and images.driver_problem("590.10", image) is None
    problem = images.driver_problem("575.57.08", image)
    assert "575.57.08 is older than 580.95.05" in problem and FORGE_1_2_1 in problem
    assert images.driver_problem("580.65.06", image)  # compared numerically per part, not as text
