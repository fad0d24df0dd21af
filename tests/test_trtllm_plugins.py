"""Plugin presets, custom TensorRT plugin libraries in the plan, and the example plugin's sources."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from trtllm_forge.builders.tensorrt_llm.plan import plan_build
from trtllm_forge.builders.tensorrt_llm.plugins import sha256_of
from trtllm_helpers import REPO, unchecked_config

from trtllm_forge.errors import ConfigError

EXAMPLE_PLUGIN = REPO / "plugins" / "forge_scale_plugin"
CALIB = {"calibration": {"dataset": "/d/c.jsonl"}}


@pytest.mark.parametrize(
    "quantization, gpu, gemm",
    [
        ({"algorithm": "none"}, "H100-SXM", "auto"),
        ({"algorithm": "fp8", **CALIB}, "H100-SXM", "disable"),
        ({"algorithm": "int4_awq", **CALIB}, "A10G", "auto"),
        ({"algorithm": "nvfp4", **CALIB}, "B200", "nvfp4"),
    ],
)
def test_gemm_plugin_preset_follows_quantization(quantization, gpu, gemm):
    plan = plan_build(unchecked_config(quantization=quantization, hardware={"gpu": gpu}))
    assert plan.build_flags["--gemm_plugin"] == gemm


def test_parallel_moe_and_lora_presets():
    plan = plan_build(
        unchecked_config(
            model={"name": "mistralai/Mixtral-8x7B-Instruct-v0.1", "family": "mixtral", "source": "/models/Mixtral"},
            parallel={"tp": 2},
            engine={"lora": {"enabled": True, "max_rank": 16}},
        )
    )
    flags = plan.build_flags
    assert flags["--nccl_plugin"] == "auto" and flags["--moe_plugin"] == "auto"
    assert flags["--lora_plugin"] == "auto" and flags["--max_lora_rank"] == "16"
    assert flags["--lora_target_modules"] == "attn_q attn_k attn_v attn_dense"
    single = plan_build(unchecked_config()).build_flags
    assert single["--nccl_plugin"] == "disable" and "--moe_plugin" not in single and "--lora_plugin" not in single


@pytest.mark.parametrize(
    "engine, fragment",
    [
        ({"plugins": {"low_latency_gemm": True}}, "engine.plugins.low_latency_gemm: is an FP8 plugin"),
        ({"plugins": {"fp8_rowwise_gemm": True}}, "engine.plugins.fp8_rowwise_gemm"),
        ({"fusion": {"gemm_swiglu": True}}, "engine.fusion.gemm_swiglu: is an FP8 fusion"),
        ({"plugins": {"gemm": "fp8"}}, "engine.plugins.gemm: fp8 needs FP8 activations"),
    ],
)
def test_fp8_only_plugins_refused_without_fp8(engine, fragment):
    with pytest.raises(ConfigError, match=fragment):
        plan_build(unchecked_config(engine=engine))


def test_custom_library_is_preloaded_and_hashed(tmp_path):
    lib = tmp_path / "libmyplugin.so"
    lib.write_bytes(b"\x7fELF fake library bytes for hashing")
    plan = plan_build(unchecked_config(engine={"plugins": {"custom_libraries": [str(lib), "/opt/gpu-host/libother.so"]}}))
    build = next(s for s in plan.steps if s.name == "build")
    assert build.env["LD_PRELOAD"] == f"{lib}:/opt/gpu-host/libother.so"
    recorded = {p.path: p.sha256 for p in plan.custom_plugins}
    assert recorded[str(lib)] == sha256_of(lib)
    assert recorded["/opt/gpu-host/libother.so"] is None
    assert "custom_plugin_not_here" in {w.code for w in plan.warnings}


def test_custom_plugin_source_folder_gets_cmake_steps():
    plan = plan_build(unchecked_config(engine={"plugins": {"custom_libraries": [str(EXAMPLE_PLUGIN)]}}))
    names = [s.name for s in plan.steps]
    assert names[:2] == ["plugin-forge_scale_plugin-configure", "plugin-forge_scale_plugin-build"]
    configure = plan.steps[0].argv
    assert configure[:5] == ["cmake", "-S", str(EXAMPLE_PLUGIN), "-B", "plugins/forge_scale_plugin/cmake-build"]
    assert "-DPLUGIN_NAME=forge_scale_plugin" in configure
    build = next(s for s in plan.steps if s.name == "build")
    assert build.env["LD_PRELOAD"] == "plugins/forge_scale_plugin/cmake-build/libforge_scale_plugin.so"


def test_custom_library_must_be_a_library_or_recipe(tmp_path):
    with pytest.raises(ConfigError, match="is not a shared library"):
        plan_build(unchecked_config(engine={"plugins": {"custom_libraries": [str(tmp_path / "plugin.txt")]}}))
    with pytest.raises(ConfigError, match=r"directory without CMakeLists.txt"):
        plan_build(unchecked_config(engine={"plugins": {"custom_libraries": [str(tmp_path)]}}))


def _tensorrt_headers() -> Path | None:
    for root in ("/usr/include", "/usr/include/x86_64-linux-gnu", "/usr/local/tensorrt/include", "/opt/tensorrt/include"):
        if (Path(root) / "NvInfer.h").is_file():
            return Path(root)
    return None


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_example_plugin_kernel_compiles_with_nvcc(tmp_path):
    out = tmp_path / "scale_kernel.o"
    result = subprocess.run(
        ["nvcc", "-c", "-std=c++17", "-arch=sm_80", str(EXAMPLE_PLUGIN / "scale_kernel.cu"), "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    symbols = subprocess.run(["nm", str(out)], capture_output=True, text=True).stdout
    assert "forgeLaunchScale" in symbols


@pytest.mark.slow
@pytest.mark.skipif(
    shutil.which("nvcc") is None or _tensorrt_headers() is None,
    reason="needs nvcc and TensorRT's headers (NvInfer.h); TensorRT is not installed on this machine",
)
def test_example_plugin_builds_with_its_cmake_recipe(tmp_path):
    build = tmp_path / "build"
    subprocess.run(
        [
            "cmake",
            "-S",
            str(EXAMPLE_PLUGIN),
            "-B",
            str(build),
            f"-DTENSORRT_ROOT={_tensorrt_headers().parent}",
            "-DPLUGIN_NAME=forge_scale_plugin",
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    subprocess.run(["cmake", "--build", str(build), "-j", "2"], check=True, capture_output=True, timeout=600)
    assert (build / "libforge_scale_plugin.so").is_file()
