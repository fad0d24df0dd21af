"""`build-engine` with engine.backend tensorrt-llm through the real CLI: dry runs of every GPU example, the
refusal without TensorRT-LLM / a GPU (exit 2, container command, empty workdir), and the llmapi target."""

from __future__ import annotations

import json
import shlex

import pytest
import yaml
from cli_inprocess import run_in_process
from trtllm_forge.builders.tensorrt_llm.container import probe
from trtllm_helpers import ENGINE_CONFIGS, LLMAPI_CONFIGS, REPO

from trtllm_forge.config import load_config

NO_TRTLLM = probe().missing("1.2.1", ["1.2.0", "1.2.1"]) is not None


@pytest.mark.parametrize("config_path", ENGINE_CONFIGS, ids=lambda p: p.stem)
def test_dry_run_json_prints_the_full_plan(tmp_path, config_path):
    workdir = tmp_path / "wd"
    result = run_in_process("build-engine", str(config_path), "--workdir", str(workdir), "--dry-run", "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    plan = doc["plan"]
    assert doc["dry_run"] is True and plan["trtllm_version"] == "1.2.1"
    names = [s["name"] for s in plan["steps"]]
    assert names[-1] in ("build", "build-draft") and "build" in names
    assert any(n in names for n in ("convert", "quantize"))
    build = next(s for s in plan["steps"] if s["name"] == "build")
    assert build["argv"][0] == "trtllm-build" and "--checkpoint_dir" in build["argv"]
    assert plan["files"]["engine/config.json"]
    assert doc["expected_engine_config"]["build_config"]["max_batch_size"] == plan["effective"]["max_batch_size"]
    assert doc["container"]["docker_run"][:2] == ["docker", "run"]
    assert "python" in plan["llmapi"] and "LLM(" in plan["llmapi"]["python"]
    assert not workdir.exists(), "a dry run writes nothing"


@pytest.mark.parametrize("config_path", LLMAPI_CONFIGS, ids=lambda p: p.stem)
def test_dry_run_json_of_llmapi_examples(tmp_path, config_path):
    workdir = tmp_path / "wd"
    result = run_in_process("build-engine", str(config_path), "--workdir", str(workdir), "--dry-run", "--json")
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)["plan"]
    quantizes = load_config(config_path).quantization.algorithm != "none"  # ModelOpt to a HF checkpoint first
    expected = ["modelopt-fetch", "modelopt-quantize"] * quantizes + ["write-model-yaml", "write-llm-api-options"]
    assert [s["name"] for s in plan["steps"]] == expected
    assert "llmapi/model.yaml" in plan["files"]
    assert not workdir.exists(), "a dry run writes nothing"


def test_dry_run_text_shows_argv_files_and_warnings(tmp_path):
    result = run_in_process(
        "build-engine", str(REPO / "configs/mistral-7b-int4awq-a10g.yaml"), "--workdir", str(tmp_path / "wd"), "--dry-run"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""
    err = result.stderr
    assert "quantize.py --model_dir /models/Mistral-7B-Instruct-v0.3" in err
    assert "--qformat int4_awq --kv_cache_dtype int8" in err
    assert "trtllm-build --checkpoint_dir checkpoint --output_dir engine" in err
    assert "int8_kv_disables_paged_context_fmha" in err
    assert "docker run" in err


@pytest.mark.skipif(not NO_TRTLLM, reason="TensorRT-LLM 1.2.x and a GPU are present: the refusal path does not apply")
@pytest.mark.parametrize("config_name", ["qwen2.5-7b-fp16-l40s-tp2.yaml", "mixtral-8x7b-fp16-h100x8-ep.yaml"])
def test_without_trtllm_exits_2_with_container_command_and_leaves_nothing(tmp_path, config_name):
    workdir = tmp_path / "wd"
    result = run_in_process("build-engine", str(REPO / "configs" / config_name), "--workdir", str(workdir))
    assert result.returncode == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1
    line = errors[0]
    assert "TensorRT-LLM 1.2.1 is not installed" in line and "no NVIDIA GPU is visible" in line
    docker = line[line.index("docker run") :]
    argv = shlex.split(docker)
    assert "--gpus" in argv and "trtllm-forge" in argv and str(REPO / "configs" / config_name) in argv
    assert (
        "trtllm-forge:0.1.0-trtllm1.2.1 (docker/Dockerfile on nvcr.io/nvidia/tritonserver:26.07-trtllm-python-py3, which serves the engine)"
        in line
    )
    assert "Traceback" not in result.stderr
    assert not workdir.exists()


def test_llmapi_target_writes_model_yaml_and_serve_command(tmp_path):
    source = yaml.safe_load((REPO / "configs/llama3.1-70b-fp8-h200-tp4.yaml").read_text())
    source["engine"]["target"] = "llmapi"
    source["name"] = "llama70b-llmapi"
    # Unquantized weights (ModelOpt's step needs a GPU: tests/test_nvidia_modelopt.py); the KV cache stays FP8 (a runtime dtype).
    source["quantization"]["algorithm"] = "none"
    config = tmp_path / "llama70b-llmapi.yaml"
    config.write_text(yaml.safe_dump(source))
    workdir = tmp_path / "wd"
    result = run_in_process("build-engine", str(config), "--workdir", str(workdir), "--json")
    assert result.returncode == 0, result.stderr
    manifest = json.loads(result.stdout)
    assert manifest["outputs"]["target"] == "llmapi"
    model_yaml = yaml.safe_load((workdir / "build/llmapi/model.yaml").read_text())
    assert model_yaml["model"] == "/models/Llama-3.1-70B-Instruct"
    assert model_yaml["backend"] == "pytorch" and model_yaml["tensor_parallel_size"] == 4
    assert model_yaml["kv_cache_config"]["dtype"] == "fp8" and model_yaml["kv_cache_config"]["enable_block_reuse"] is True
    assert model_yaml["scheduler_config"]["capacity_scheduler_policy"] == "MAX_UTILIZATION"
    assert model_yaml["triton_config"] == {"max_batch_size": 0, "decoupled": True}
    options = yaml.safe_load((workdir / "build/llmapi/extra_llm_api_options.yaml").read_text())
    assert "triton_config" not in options and options["enable_chunked_prefill"] is True
    serve = json.loads((workdir / "build/llmapi/serve.json").read_text())["argv"]
    assert serve[:2] == ["trtllm-serve", "/models/Llama-3.1-70B-Instruct"]
    assert serve[serve.index("--tp_size") + 1] == "4"
    assert serve[serve.index("--extra_llm_api_options") + 1] == "llmapi/extra_llm_api_options.yaml"
    assert "quantized_checkpoint" not in manifest["outputs"] and not any("ModelOpt" in note for note in manifest["notes"])
    # unchanged inputs: the stage is skipped
    again = run_in_process("build-engine", str(config), "--workdir", str(workdir), "--json")
    assert json.loads(again.stdout)["skipped"] is True


def test_llmapi_speculative_eagle_config(tmp_path):
    source = yaml.safe_load((REPO / "configs/llama3.1-8b-fp8-h100.yaml").read_text())
    assert source["engine"]["target"] == "llmapi"
    config = tmp_path / "eagle-llmapi.yaml"
    config.write_text(yaml.safe_dump(source))
    result = run_in_process("build-engine", str(config), "--workdir", str(tmp_path / "wd"), "--dry-run", "--json")
    assert result.returncode == 0, result.stderr
    llmapi = json.loads(result.stdout)["plan"]["llmapi"]
    assert llmapi["model_yaml"]["speculative_config"] == {
        "decoding_type": "Eagle",  # engine.llmapi_version 1.2.1 (deploy.server triton's default)
        "max_draft_len": 3,
        "speculative_model_dir": "/models/EAGLE3-LLaMA3.1-Instruct-8B",
    }
