"""Quantization: which tool produces the checkpoint, with which flags, and whether the target GPU allows it."""

from __future__ import annotations

from dataclasses import dataclass

from trtllm_forge.builders.tensorrt_llm.spec import Spec

from trtllm_forge.errors import ConfigError

# Our config's algorithm names → quantize.py --qformat (the ModelOpt flow).
QFORMAT = {
    "none": "full_prec",
    "fp8": "fp8",
    "int4_awq": "int4_awq",
    "w4a8_awq": "w4a8_awq",
    "int8_sq": "int8_sq",
    "int8_wo": "int8_wo",
    "int4_wo": "int4_wo",
    "nvfp4": "nvfp4",
}
# Weight-only formats convert_checkpoint.py handles without calibration.
CONVERT_WEIGHT_ONLY = {"int8_wo": "int8", "int4_wo": "int4"}


@dataclass(frozen=True)
class QuantChoice:
    algorithm: str  # our name
    kv_cache: str  # none | fp8 | int8
    quant_algo: str | None  # TensorRT-LLM QuantAlgo, None = unquantized
    kv_cache_quant_algo: str | None
    tool: str  # "quantize.py" or "convert_checkpoint.py"
    qformat: str | None
    needs_calibration: bool


def plain(value: object) -> str:
    """Enum defaults are not converted by pydantic's use_enum_values; compare and print their values."""
    return str(getattr(value, "value", value))


def choose(algorithm: str, kv_cache: str, spec: Spec) -> QuantChoice:
    algorithm, kv_cache = plain(algorithm), plain(kv_cache)
    qformat = QFORMAT[algorithm]
    quant_algo = spec.data["qformat_to_quant_algo"]["map"][qformat]
    kv_algo = None if kv_cache == "none" else kv_cache.upper()
    if quant_algo is not None and quant_algo not in spec.data["quant_algos"]["quant_algo"]:
        raise ConfigError("quantization.algorithm", f"{quant_algo} is not a QuantAlgo of TensorRT-LLM {spec.version}", "")
    if kv_algo is not None and kv_algo not in spec.data["quant_algos"]["kv_cache_quant_algo"]:
        raise ConfigError("quantization.kv_cache", f"{kv_algo} is not a KV-cache QuantAlgo of {spec.version}", "fp8 or int8")
    calibrated = algorithm not in ("none", *CONVERT_WEIGHT_ONLY) or kv_cache != "none"
    tool = "quantize.py" if calibrated else "convert_checkpoint.py"
    return QuantChoice(algorithm, kv_cache, quant_algo, kv_algo, tool, qformat if calibrated else None, calibrated)


def sm_of(compute_capability: float) -> int:
    """8.9 → 89, 10.0 → 100 (the builder's own SM numbering)."""
    return round(compute_capability * 10)


def capability_problems(choice: QuantChoice, sm: int, gpu: str, spec: Spec, plugin_flags: dict[str, str]) -> list[ConfigError]:
    """Every GPU-capability rule of the spec that the plan breaks, as config errors."""
    cap = spec.capability
    problems: list[ConfigError] = []
    low, high = cap["blackwell_engine_range"]
    for key, field, label in (
        (choice.quant_algo, "quantization.algorithm", choice.algorithm),
        (choice.kv_cache_quant_algo and f"KV:{choice.kv_cache_quant_algo}", "quantization.kv_cache", f"{choice.kv_cache} KV cache"),
    ):
        if not key:
            continue
        need = cap["min_sm"].get(key)
        if need is not None and sm < need:
            problems.append(
                ConfigError(
                    field,
                    f"{label} needs compute capability >= {need / 10:.1f} but {gpu} is {sm / 10:.1f}",
                    _alternatives(field, sm),
                )
            )
        if low <= sm < high and key in cap["blackwell_rejected"]:
            problems.append(
                ConfigError(
                    field,
                    f"{label} is rejected by the TensorRT-LLM {spec.version} engine builder on {gpu} (SM {sm}): "
                    f"{cap['blackwell_rejected'][key]}",
                    _alternatives(field, sm),
                )
            )
    if sm == 100:
        for plugin in cap["plugins_rejected_on_sm100"]:
            value = plugin_flags.get(f"--{plugin}")
            if value not in (None, "disable"):
                problems.append(
                    ConfigError(
                        f"engine.plugins ({plugin})",
                        f"{plugin}={value} is not supported on SM 100 ({gpu})",
                        "disable it for this GPU",
                    )
                )
    return problems


def _alternatives(field: str, sm: int) -> str:
    if field == "quantization.kv_cache":
        return "use fp8 or none" if sm >= 89 else "use int8 or none"
    if 100 <= sm < 120:
        return "use fp8 or nvfp4 on Blackwell"
    if sm >= 89:
        return "use fp8, int4_awq or none"
    return "use int4_awq, int8_wo, int8_sq or none on this GPU"
