"""What an ONNX Runtime GenAI build will do, decided from the config alone: the precision and the model builder's
command (`python -m onnxruntime_genai.models.builder -i <checkpoint> -o <out> -p fp32|int8|int4 -e cpu`). Free of
side effects so `--dry-run` and the real build share one source of truth.

Quantization mapping (`quantization.algorithm` → the builder's `--precision`):
    none     → fp32 (the CPU execution provider computes in fp32; a float16/bfloat16 checkpoint is widened)
    int8_wo  → int8 weight-only (MatMulNBits, block_size = quantization.group_size)
    int4_wo  → int4 weight-only, round to nearest (MatMulNBits, block_size = quantization.group_size)
int4_awq and a quantized KV cache are not offered by the builder on CPU and are refused.
"""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from trtllm_forge.builders.onnxruntime.engine import ENGINE, PRECISIONS

from trtllm_forge.config import ForgeConfig
from trtllm_forge.errors import ConfigError

BACKEND = ENGINE.backend
BUILDER_MODULE = "onnxruntime_genai.models.builder"
# Files the engine directory must hold after an export; the CPU engine model loads them with onnxruntime_genai.
MODEL_FILES = ("model.onnx", "model.onnx.data", "genai_config.json")
# TensorRT-LLM's names for the algorithms, so pretrained_config.quantization reads like a TRT-LLM engine's.
QUANT_ALGO_NAMES = {"none": None, "int8_wo": "W8A16", "int4_wo": "W4A16"}
BLOCK_SIZES = (16, 32, 64, 128, 256)  # MatMulNBits block sizes the builder accepts
# MatMulNBits accuracy level on the CPU: 4 = int8 activations (the builder's CPU default, written out so the
# recorded command says what ran).
CPU_ACCURACY_LEVEL = 4


@dataclass(frozen=True)
class OrtExportPlan:
    precision: str  # fp32 | int8 | int4
    quant_algo: str | None
    block_size: int | None
    accuracy_level: int | None
    argv: list[str] = field(default_factory=list)

    @property
    def dtype(self) -> str:
        """pretrained_config.dtype: what the unquantized parts and activations are computed in."""
        return "float32"

    @property
    def group_size(self) -> int | None:
        return self.block_size

    @property
    def kv_cache_quant_algo(self) -> None:
        return None  # the KV cache stays in fp32

    def to_json(self) -> dict:
        return asdict(self)


def plan_export(config: ForgeConfig, checkpoint_dir: Path | None, output_dir: Path, cache_dir: Path) -> OrtExportPlan:
    quant = config.quantization
    algorithm = str(getattr(quant.algorithm, "value", quant.algorithm))
    if algorithm not in PRECISIONS:
        raise ConfigError(
            "quantization.algorithm", f"{algorithm} is not available on the {BACKEND} backend", f"one of {', '.join(PRECISIONS)}"
        )
    if quant.kv_cache != "none":
        raise ConfigError("quantization.kv_cache", f"{quant.kv_cache} is not available on {BACKEND}", "use none")
    precision = PRECISIONS[algorithm]
    quantized = precision != "fp32"
    if quantized and quant.group_size not in BLOCK_SIZES:
        raise ConfigError(
            "quantization.group_size",
            f"{quant.group_size} is not a block size the ONNX Runtime GenAI builder takes",
            f"one of {', '.join(str(b) for b in BLOCK_SIZES)}",
        )
    model = str(checkpoint_dir) if checkpoint_dir else "<checkpoint>"
    argv = [sys.executable, "-m", BUILDER_MODULE, "-i", model, "-o", str(output_dir), "-p", precision, "-e", "cpu", "-c", str(cache_dir)]
    extra = [f"block_size={quant.group_size}", f"accuracy_level={CPU_ACCURACY_LEVEL}"] if quantized else []
    if config.model.trust_remote_code:
        extra.append("hf_remote=true")
    if extra:
        argv += ["--extra_options", *extra]
    return OrtExportPlan(
        precision=precision,
        quant_algo=QUANT_ALGO_NAMES[algorithm],
        block_size=quant.group_size if quantized else None,
        accuracy_level=CPU_ACCURACY_LEVEL if quantized else None,
        argv=argv,
    )
