"""The execution path of the TensorRT-LLM builder, run against a FAKE TensorRT-LLM.

TensorRT-LLM cannot be installed here (no GPU; PyPI only has stubs), so these tests put fakes on PATH /
PYTHONPATH, each named as such: a `tensorrt_llm` distribution (metadata only), `nvidia-smi`, `trtllm-build`
and the example scripts (`quantize.py`, `convert_checkpoint.py`). They check what trtllm-forge does around
them: step order and argv, per-step logs, the offline calibration data, the temp-dir-then-rename stage,
manifest.json (versions, parsed build metrics, custom plugin sha256), skip on unchanged inputs, the
version-mismatch note, and a failing step leaving no build directory.
"""

from __future__ import annotations

import json
import os
import stat
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from tiny_checkpoint import write_checkpoint_config

FAKE_QUANTIZE = """
import argparse, json, os, pathlib, sys
if os.environ.get("FAKE_FAIL") == "quantize":
    print("FAKE quantize.py: failing on purpose"); sys.exit(3)
p = argparse.ArgumentParser()
for flag in ["--model_dir", "--dtype", "--qformat", "--kv_cache_dtype", "--calib_dataset", "--calib_size",
             "--calib_max_seq_length", "--batch_size", "--tp_size", "--pp_size", "--device", "--output_dir", "--awq_block_size"]:
    p.add_argument(flag)
a = p.parse_args()
assert os.environ["HF_DATASETS_OFFLINE"] == "1"
lines = pathlib.Path(a.calib_dataset, "train.jsonl").read_text().splitlines()
out = pathlib.Path(a.output_dir); out.mkdir(parents=True)
hf = json.loads(pathlib.Path(a.model_dir, "config.json").read_text())
cfg = {"architecture": "LlamaForCausalLM", "dtype": a.dtype, "vocab_size": hf["vocab_size"],
       "mapping": {"world_size": int(a.tp_size), "tp_size": int(a.tp_size), "pp_size": int(a.pp_size)},
       "quantization": {"quant_algo": a.qformat.upper(), "kv_cache_quant_algo": (a.kv_cache_dtype or "").upper() or None},
       "calibration_samples": len(lines)}
(out / "config.json").write_text(json.dumps(cfg))
(out / "rank0.safetensors").write_bytes(b"FAKE")
print("FAKE quantize.py wrote", out)
"""

FAKE_TRTLLM_BUILD = """
import json, os, pathlib, sys
args = sys.argv[1:]
def value(flag, default=None):
    return args[args.index(flag) + 1] if flag in args else default
ckpt = json.loads(pathlib.Path(value("--checkpoint_dir"), "config.json").read_text())
out = pathlib.Path(value("--output_dir")); out.mkdir(parents=True)
seq = int(value("--max_seq_len"))
build = {"max_batch_size": int(value("--max_batch_size")), "max_input_len": int(value("--max_input_len")),
         "max_seq_len": seq, "max_num_tokens": int(os.environ.get("FAKE_MAX_NUM_TOKENS") or value("--max_num_tokens")),
         "max_beam_width": 1,
         "kv_cache_type": "PAGED", "max_draft_len": 0, "speculative_decoding_mode": 1,
         "plugin_config": {"tokens_per_block": int(value("--tokens_per_block")), "paged_kv_cache": True,
                           "use_paged_context_fmha": value("--use_paged_context_fmha") == "enable",
                           "use_fp8_context_fmha": value("--use_fp8_context_fmha") == "enable", "context_fmha": True,
                           "reduce_fusion": False, "use_fused_mlp": True}}
config = {"version": os.environ.get("FAKE_TRTLLM_VERSION", "1.2.1"), "pretrained_config": ckpt, "build_config": build}
(out / "config.json").write_text(json.dumps(config))
(out / "rank0.engine").write_bytes(b"FAKE ENGINE")
(out / "ld_preload.txt").write_text(os.environ.get("LD_PRELOAD", ""))
pathlib.Path("model.cache").write_bytes(b"FAKE CACHE")
print("[TRT-LLM] [I] Build phase peak memory: 2048.00 MB, children: 0.00 MB")
print("[TRT-LLM] [I] Total time of building all engines: 00:00:01")
"""

FAKE_NVIDIA_SMI = """
import os, sys
if "--query-gpu=driver_version" in sys.argv:
    print(os.environ.get("FAKE_DRIVER", "590.44.01"))
else:
    print("GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-FAKE)")
"""


def _script(path: Path, body: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!{sys.executable}\n# FAKE for tests: stands in for the real TensorRT-LLM tool\n" + textwrap.dedent(body))
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


@pytest.fixture
def fake_trtllm(tmp_path):
    """PATH, PYTHONPATH and examples dir holding the FAKE TensorRT-LLM pieces; returns the env for run_cli."""
    root = tmp_path / "fake-trtllm"
    bin_dir, site, examples = root / "bin", root / "site", root / "examples"
    _script(bin_dir / "trtllm-build", FAKE_TRTLLM_BUILD)
    _script(bin_dir / "nvidia-smi", FAKE_NVIDIA_SMI)
    _script(examples / "quantization" / "quantize.py", FAKE_QUANTIZE)
    (site / "tensorrt_llm").mkdir(parents=True)
    (site / "tensorrt_llm" / "__init__.py").write_text('raise ImportError("FAKE tensorrt_llm: metadata only")\n')
    dist = site / "tensorrt_llm-1.2.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: tensorrt_llm\nVersion: 1.2.1\n")
    return {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": str(site),
        "TRTLLM_FORGE_EXAMPLES_DIR": str(examples),
    }


@pytest.fixture
def gpu_project(tmp_path):
    hf = write_checkpoint_config(tmp_path / "hf-llama", torch_dtype="bfloat16")
    calib = tmp_path / "calib.jsonl"
    calib.write_text("".join(json.dumps({"text": f"calibration sample {i}"}) + "\n" for i in range(20)))
    plugin = tmp_path / "libfake_plugin.so"
    plugin.write_bytes(b"FAKE plugin library (not ELF)")
    config = {
        "name": "fake-gpu",
        "model": {"source": str(hf), "family": "llama"},
        "engine": {
            "backend": "tensorrt-llm",
            "target": "engine",
            "max_batch_size": 4,
            "max_input_len": 512,
            "max_seq_len": 1024,
            "max_num_tokens": 2048,
            "plugins": {"custom_libraries": [str(plugin)]},
        },
        "quantization": {"algorithm": "fp8", "kv_cache": "fp8", "calibration": {"dataset": str(calib), "size": 8}},
        "hardware": {"gpu": "H100-SXM"},
    }
    path = tmp_path / "fake-gpu.yaml"
    path.write_text(yaml.safe_dump(config))
    return path, plugin


def test_fake_trtllm_build_runs_steps_and_records_manifest(cli, tmp_path, fake_trtllm, gpu_project):
    config, plugin = gpu_project
    workdir = tmp_path / "wd"
    result = cli("build-engine", str(config), "--workdir", str(workdir), "--json", env=fake_trtllm)
    assert result.returncode == 0, result.stderr
    manifest = json.loads(result.stdout)
    build = workdir / "build"
    assert manifest["outputs"]["engine_dir"] == str(build / "engine")
    assert (build / "engine" / "rank0.engine").read_bytes() == b"FAKE ENGINE"
    assert json.loads((build / "checkpoint" / "config.json").read_text())["calibration_samples"] == 8
    assert len((build / "calibration" / "train.jsonl").read_text().splitlines()) == 8
    assert (build / "plan.json").is_file() and (build / "model.cache").is_file()
    assert [c["argv"][0] for c in manifest["commands"]] == ["python3", "trtllm-build"]
    assert manifest["tool_versions"]["tensorrt_llm"] == "1.2.1"
    assert "H100" in manifest["tool_versions"]["gpus"]
    assert "build build_peak_host_memory: 2048.00 MB" in manifest["notes"]
    assert "build build_time: 00:00:01" in manifest["notes"]
    assert set(manifest["timings"]) >= {"prepare-calibration", "quantize", "build", "total_s"}
    recorded = manifest["outputs"]["custom_plugins"]
    assert recorded[0]["path"] == str(plugin) and len(recorded[0]["sha256"]) == 64
    assert manifest["outputs"]["ld_preload"] == str(plugin)
    assert (build / "engine" / "ld_preload.txt").read_text() == str(plugin)
    assert (workdir / "logs" / "build-quantize.log").is_file() and (workdir / "logs" / "build-build.log").is_file()
    assert not [p for p in workdir.iterdir() if p.name.startswith(".build")]

    serving = manifest["outputs"]["serving_image"]
    assert serving["image"] == "nvcr.io/nvidia/tritonserver:26.07-trtllm-python-py3" and serving["route"] == "ngc"
    assert serving["tensorrt_llm"] == "1.2.1" and serving["base_image"] is None and serving["min_driver"] == "590.44.01"
    assert serving["driver_seen"] == "590.44.01" and manifest["tool_versions"]["nvidia_driver"] == "590.44.01"

    again = cli("build-engine", str(config), "--workdir", str(workdir), "--json", env=fake_trtllm)
    assert again.returncode == 0 and json.loads(again.stdout)["skipped"] is True


def test_fake_driver_older_than_the_image_minimum_is_refused(cli, tmp_path, fake_trtllm, gpu_project):
    config, _ = gpu_project
    workdir = tmp_path / "wd"
    result = cli("build-engine", str(config), "--workdir", str(workdir), env={**fake_trtllm, "FAKE_DRIVER": "580.95.05"})
    assert result.returncode == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "NVIDIA driver 580.95.05 is older than 590.44.01" in errors[0]
    assert "nvcr.io/nvidia/tritonserver:26.07-trtllm-python-py3" in errors[0] and "Traceback" not in result.stderr
    assert not (workdir / "build").exists()


def test_fake_trtllm_version_mismatch_and_adjustments_are_reported(cli, tmp_path, fake_trtllm, gpu_project):
    config, _ = gpu_project
    env = {**fake_trtllm, "FAKE_TRTLLM_VERSION": "1.2.0", "FAKE_MAX_NUM_TOKENS": "1024"}
    result = cli("build-engine", str(config), "--workdir", str(tmp_path / "wd"), "--json", env=env)
    assert result.returncode == 0, result.stderr
    notes = json.loads(result.stdout)["notes"]
    assert any("engine built by TensorRT-LLM 1.2.0 but serving is pinned to 1.2.1" in n for n in notes)
    assert "adjusted by trtllm-build: build_config.max_num_tokens: planned 2048, engine has 1024" in notes


def test_fake_trtllm_failing_step_exits_1_and_keeps_only_logs(cli, tmp_path, fake_trtllm, gpu_project):
    config, _ = gpu_project
    workdir = tmp_path / "wd"
    result = cli("build-engine", str(config), "--workdir", str(workdir), env={**fake_trtllm, "FAKE_FAIL": "quantize"})
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "build.quantize" in errors[0] and "exited with 3" in errors[0]
    assert not (workdir / "build").exists()
    assert "failing on purpose" in (workdir / "logs" / "build-quantize.log").read_text()
    assert not [p for p in workdir.iterdir() if p.name.startswith(".build")]
