"""TensorRT-LLM plugin presets (chosen from dtype, quantization and parallelism) and custom TensorRT
plugin libraries (loaded before the build, recorded with their sha256, carried to serving)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from trtllm_forge.config.schema import ForgeConfig
from trtllm_forge.errors import ConfigError

# gemm_plugin per quantization when the config says "auto": the cuBLASLt plugin helps FP16/BF16 GEMMs and
# weight-only/AWQ models; for FP8 TensorRT's own FP8 GEMMs are faster, and NVFP4 needs its own plugin.
GEMM_PRESET = {
    "none": "auto",
    "int8_wo": "auto",
    "int4_wo": "auto",
    "int4_awq": "auto",
    "w4a8_awq": "auto",
    "int8_sq": "auto",
    "fp8": "disable",
    "nvfp4": "nvfp4",
}
FP8_ACTIVATIONS = {"fp8", "w4a8_awq", "nvfp4"}
# trtllm-build's default for --use_fp8_context_fmha (spec trtllm_build table, from NVIDIA's plugin.py): on, and the
# builder itself keeps it only for FP8/W4A8_AWQ/NVFP4 on SM >= 89. We pass NVIDIA's default unless the config
# sets engine.plugins.fp8_context_fmha explicitly.
NVIDIA_FP8_CONTEXT_FMHA_DEFAULT = True


def _toggle(value: bool) -> str:
    return "enable" if value else "disable"


def fp8_context_fmha_wanted(config: ForgeConfig) -> bool:
    plugins = config.engine.plugins
    return plugins.fp8_context_fmha if "fp8_context_fmha" in plugins.model_fields_set else NVIDIA_FP8_CONTEXT_FMHA_DEFAULT


def draft_plugin_flags(config: ForgeConfig, is_moe: bool) -> dict[str, str]:
    """Plugin flags for a draft-target draft engine: the draft checkpoint is converted unquantized, so its
    GEMM plugin and FP8-only features follow quantization none, not the (possibly FP8) target's."""
    return plugin_flags(config, is_moe, algo="none")


def plugin_flags(config: ForgeConfig, is_moe: bool, algo: str | None = None) -> dict[str, str]:
    """trtllm-build plugin and feature flags (flag → value) for this config, before silent adjustments."""
    eng, quant, par = config.engine, config.quantization, config.parallel
    p = eng.plugins
    draft = algo is not None
    algo = algo or str(getattr(quant.algorithm, "value", quant.algorithm))
    flags: dict[str, str] = {
        "--gpt_attention_plugin": p.gpt_attention,
        "--gemm_plugin": GEMM_PRESET[algo] if p.gemm == "auto" or (draft and p.gemm == "fp8") else p.gemm,
        "--nccl_plugin": ("auto" if par.world_size > 1 else "disable") if p.nccl == "auto" else p.nccl,
        "--context_fmha": _toggle(p.context_fmha),
        "--use_paged_context_fmha": _toggle(p.paged_context_fmha),
        "--use_fp8_context_fmha": _toggle(fp8_context_fmha_wanted(config) and not draft),
        "--remove_input_padding": _toggle(p.remove_input_padding),
        "--reduce_fusion": _toggle(eng.fusion.reduce_fusion),
        "--user_buffer": _toggle(eng.fusion.user_buffer),
        "--multiple_profiles": "enable",
    }
    if is_moe:
        flags["--moe_plugin"] = p.moe
    if draft:
        return flags  # FP8/FP4-only plugins and LoRA belong to the target engine
    if p.gemm == "fp8" and algo not in FP8_ACTIVATIONS:
        raise ConfigError("engine.plugins.gemm", f"fp8 needs FP8 activations but quantization is {algo}", "use auto")
    if p.low_latency_gemm:
        if algo != "fp8":
            raise ConfigError("engine.plugins.low_latency_gemm", f"is an FP8 plugin but quantization is {algo}", "set false or use fp8")
        flags["--low_latency_gemm_plugin"] = "fp8"
    if p.fp8_rowwise_gemm:
        raise ConfigError(
            "engine.plugins.fp8_rowwise_gemm",
            "needs FP8 rowwise (per-channel/per-token) weights, which quantization.algorithm does not offer",
            "set false",
        )
    if eng.fusion.gemm_swiglu:
        if algo != "fp8":
            raise ConfigError("engine.fusion.gemm_swiglu", f"is an FP8 fusion but quantization is {algo}", "set false or use fp8")
        flags["--gemm_swiglu_plugin"] = "fp8"
    if eng.fusion.fuse_fp4_quant:
        if algo != "nvfp4":
            raise ConfigError("engine.fusion.fuse_fp4_quant", f"needs nvfp4 but quantization is {algo}", "set false")
        flags["--fuse_fp4_quant"] = "enable"
    if eng.lora.enabled:
        flags["--lora_plugin"] = "auto"
    return flags


@dataclass(frozen=True)
class CustomPlugin:
    """A custom TensorRT plugin library: a built .so, or a source folder built with its CMake recipe."""

    path: str
    kind: str  # "library" | "source"
    sha256: str | None  # None when the file is not on this machine (it lives on the GPU host)
    library: str  # the .so that is loaded (for a source folder: where the recipe puts it)


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def custom_plugins(config: ForgeConfig) -> list[CustomPlugin]:
    out = []
    for index, entry in enumerate(config.engine.plugins.custom_libraries):
        where = f"engine.plugins.custom_libraries[{index}]"
        path = config.resolve_path(entry)
        if path.is_dir():
            if not (path / "CMakeLists.txt").is_file():
                raise ConfigError(where, f"{path} is a directory without CMakeLists.txt", "point at a .so or a plugin source folder")
            name = path.name.replace("-", "_")
            out.append(CustomPlugin(str(path), "source", None, f"plugins/{name}/cmake-build/lib{name}.so"))
        elif path.suffix != ".so" and ".so." not in path.name:
            raise ConfigError(where, f"{path} is not a shared library", "a .so file or a plugin source folder with CMakeLists.txt")
        else:
            out.append(CustomPlugin(str(path), "library", sha256_of(path) if path.is_file() else None, str(path)))
    return out


def preload_value(plugins: list[CustomPlugin], base: Path | None = None) -> str:
    """LD_PRELOAD for the build and serving processes (colon-separated, in config order)."""
    libs = []
    for plugin in plugins:
        lib = Path(plugin.library)
        libs.append(str(base / lib if base is not None and not lib.is_absolute() else lib))
    return ":".join(libs)
