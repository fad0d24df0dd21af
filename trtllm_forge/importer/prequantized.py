"""A checkpoint that is already quantized: ModelOpt's export (`hf_quant_config.json`, and the `quantization_config`
it writes into config.json) or another tool's `quantization_config`. The LLM API loads such a checkpoint as it is,
so the LLM-API build plans no quantization step for it.

ModelOpt's spellings (FP8, W4A16_AWQ, ...) are its per-layer quant_algo table (NVIDIA/Model-Optimizer 0.37.0
modelopt/torch/export/quant_utils.py); examples in tests/fixtures/nvidia_modelopt/ (SOURCE there).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from trtllm_forge.errors import ConfigError

HF_QUANT_CONFIG = "hf_quant_config.json"
# ModelOpt's quant_algo → quantization.algorithm (the formats trtllm-forge names; others are read but have no name here).
MODELOPT_ALGORITHMS = {"FP8": "fp8", "W4A16_AWQ": "int4_awq", "W4A8_AWQ": "w4a8_awq", "NVFP4": "nvfp4", "W8A8_SQ_PER_CHANNEL": "int8_sq"}


@dataclass(frozen=True)
class PreQuantized:
    """What a checkpoint says about its own quantization, and where it says it."""

    file: Path
    field: str  # the dotted field read, e.g. "quantization.quant_algo"
    quant_algo: str  # as the file spells it (ModelOpt: FP8, W4A16_AWQ, NVFP4, ...; other tools: their quant_method)
    kv_cache_quant_algo: str | None
    producer: str | None  # e.g. "modelopt 0.23.0"

    @property
    def algorithm(self) -> str | None:
        """The matching quantization.algorithm, None when trtllm-forge has no name for the format."""
        return MODELOPT_ALGORITHMS.get(self.quant_algo.upper())

    def describe(self) -> str:
        return f"pre-quantized ({self.quant_algo}) — from {self.file.name}"


def _load(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError("model.source", f"{path} cannot be read as JSON ({exc})", "a valid JSON file") from None
    if not isinstance(data, dict):
        raise ConfigError("model.source", f"{path} holds {type(data).__name__}, not a JSON object", "a JSON object")
    return data


def _producer(data: dict) -> str | None:
    producer = data.get("producer")
    if isinstance(producer, dict) and producer.get("name"):
        return " ".join(str(producer[key]) for key in ("name", "version") if producer.get(key))
    return None


def read_prequantized(checkpoint_dir: Path) -> PreQuantized | None:
    """The checkpoint's own quantization: hf_quant_config.json's `quantization.quant_algo` (ModelOpt), else
    config.json's `quantization_config` (`quant_algo`, else `quant_method`); None for an unquantized checkpoint or a
    folder that is not here."""
    hf_quant = checkpoint_dir / HF_QUANT_CONFIG
    if hf_quant.is_file():
        data = _load(hf_quant)
        section = data.get("quantization")
        algo = section.get("quant_algo") if isinstance(section, dict) else None
        if not isinstance(algo, str) or not algo:
            # ModelOpt writes quant_algo null for a KV-cache-only export: the weights are not quantized.
            return None
        assert isinstance(section, dict)
        kv = section.get("kv_cache_quant_algo")
        return PreQuantized(hf_quant, "quantization.quant_algo", algo, kv if isinstance(kv, str) else None, _producer(data))
    config_json = checkpoint_dir / "config.json"
    if not config_json.is_file():
        return None
    quant = _load(config_json).get("quantization_config")
    if not isinstance(quant, dict):
        return None
    for key in ("quant_algo", "quant_method"):
        value = quant.get(key)
        if isinstance(value, str) and value:
            kv = quant.get("kv_cache_scheme")
            return PreQuantized(config_json, f"quantization_config.{key}", value, kv if isinstance(kv, str) else None, _producer(quant))
    return None


def check_declared(pre: PreQuantized, declared: str) -> None:
    """Refuse (exit 2, one line naming the file and field) a quantization.algorithm other than the checkpoint's.
    `none` declares nothing: the checkpoint is loaded as it is."""
    if declared == "none" or declared == pre.algorithm:
        return
    valid = f"quantization.algorithm: {pre.algorithm}" if pre.algorithm else "quantization.algorithm: none (load it as it is)"
    raise ConfigError(
        "quantization.algorithm",
        f"{declared}, but the checkpoint is already quantized: {pre.file} {pre.field} is {pre.quant_algo}",
        f"{valid}, or a model.source that is not quantized",
    )
