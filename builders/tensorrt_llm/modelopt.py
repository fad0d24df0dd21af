"""The LLM-API path's quantization step: ModelOpt's post-training quantization of the checkpoint to a Hugging Face
checkpoint (which the PyTorch backend loads pre-quantized), run in NVIDIA's TensorRT-LLM release image of the
config's LLM-API version (builders/tensorrt_llm/images.py `release_image`: it installs ModelOpt 0.37).

The script is ModelOpt's `examples/llm_ptq/hf_ptq.py` at the 0.37.0 tag (not in the release image: cloned beside
the export); its flags are checked against the pinned argparse block (tests/fixtures/nvidia_modelopt/). The export
lands at an absolute path in the workdir (`quantized_dir`), outside the build stage's temporary folder, so the same
path is what the docker command writes, what the build manifest records and what model.yaml loads.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from trtllm_forge.builders.tensorrt_llm.images import GPU_CONTAINER_FLAGS, release_image

from trtllm_forge.config.schema import ForgeConfig
from trtllm_forge.errors import ConfigError
from trtllm_forge.importer.prequantized import HF_QUANT_CONFIG

MODELOPT_REPOSITORY = "https://github.com/NVIDIA/Model-Optimizer.git"
MODELOPT_TAG = "0.37.0"  # commit df0882a63c39a001a1be384b680166a41259045c; the line TensorRT-LLM 1.2/1.3 require
HF_PTQ = "examples/llm_ptq/hf_ptq.py"
# quantization.algorithm → hf_ptq.py --qformat (a key of its QUANT_CFG_CHOICES).
QFORMAT = {"fp8": "fp8", "int4_awq": "int4_awq", "w4a8_awq": "w4a8_awq", "nvfp4": "nvfp4"}
# quantization.kv_cache → --kv_cache_qformat (a key of KV_QUANT_CFG_CHOICES). Always written: its default is fp8,
# so leaving it out would quantize the KV cache of a config that asked for none.
KV_QFORMAT = {"none": "none", "fp8": "fp8"}
QUANTIZED_ROOT = "quantized-hf"  # under the workdir


@dataclass(frozen=True)
class QuantizePlan:
    """The ModelOpt step: where its script comes from, the exact commands, the image and the absolute export path."""

    image: str
    modelopt: str  # the nvidia-modelopt requirement of the image's TensorRT-LLM
    export_dir: Path  # absolute: the quantized Hugging Face checkpoint
    examples_dir: Path  # absolute: ModelOpt's repository at MODELOPT_TAG, cloned beside the export
    fetch_argv: list[str]
    quantize_argv: list[str]
    qformat: str
    kv_qformat: str
    notes: list[tuple[str, str]] = field(default_factory=list)  # (field, why) of config fields the step does not use

    def docker_argv(self, model_dir: str, gpus: int) -> list[str]:
        """The quantize command inside the release image: the checkpoint read-only and the export's folder
        read-write, both at the same paths."""
        root = str(self.export_dir.parent)
        return [
            "docker",
            "run",
            "--rm",
            "--gpus",
            str(gpus),
            *GPU_CONTAINER_FLAGS,
            "-v",
            f"{model_dir}:{model_dir}:ro",
            "-v",
            f"{root}:{root}:rw",
            "-w",
            root,
            self.image,
            *self.quantize_argv,
        ]


def export_complete(export_dir: Path) -> bool:
    """Whether ModelOpt finished this export: it writes hf_quant_config.json first and config.json's
    quantization_config last (modelopt/torch/export/unified_export_hf.py export_hf_checkpoint, 0.37.0)."""
    if not (export_dir / HF_QUANT_CONFIG).is_file() or not (export_dir / "config.json").is_file():
        return False
    try:
        config = json.loads((export_dir / "config.json").read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return isinstance(config, dict) and isinstance(config.get("quantization_config"), dict)


def quantized_dir(workdir: Path, qformat: str, kv_qformat: str, calib_size: int) -> Path:
    """Where the export of these settings lands (absolute; another format or calibration size gets another folder)."""
    return Path(workdir).resolve() / QUANTIZED_ROOT / f"{qformat}-kv{kv_qformat}-calib{calib_size}"


def plan_quantize(config: ForgeConfig, model_dir: str, workdir: Path, llmapi_version: str) -> QuantizePlan | None:
    """The ModelOpt step of this config, None when quantization.algorithm is none."""
    quant = config.quantization
    if quant.algorithm == "none":
        return None
    if quant.algorithm not in QFORMAT:
        raise ConfigError(
            "quantization.algorithm",
            f"{quant.algorithm} has no ModelOpt Hugging Face export that the LLM API loads",
            f"one of none, {', '.join(QFORMAT)} (or a pre-quantized model.source)",
        )
    if quant.kv_cache not in KV_QFORMAT:
        raise ConfigError(
            "quantization.kv_cache",
            f"{quant.kv_cache} is not a KV-cache format of ModelOpt's hf_ptq.py {MODELOPT_TAG} (none, fp8, nvfp4, nvfp4_affine)",
            f"one of {', '.join(KV_QFORMAT)}",
        )
    qformat, kv_qformat, size = QFORMAT[quant.algorithm], KV_QFORMAT[quant.kv_cache], quant.calibration.size
    export_dir = quantized_dir(workdir, qformat, kv_qformat, size)
    examples_dir = export_dir.parent / f"Model-Optimizer-{MODELOPT_TAG}"
    release = release_image(llmapi_version)
    argv = [
        "python3",
        str(examples_dir / HF_PTQ),
        "--pyt_ckpt_path",
        model_dir,
        "--qformat",
        qformat,
        "--kv_cache_qformat",
        kv_qformat,
        "--calib_size",
        str(size),
        "--export_path",
        str(export_dir),
    ]
    if config.model.trust_remote_code:
        argv.append("--trust_remote_code")
    notes = []
    unused = [name for name in ("dataset", "seq_len") if name in quant.calibration.model_fields_set]
    if unused:
        notes.append(
            (
                "quantization.calibration",
                f"hf_ptq.py {MODELOPT_TAG} calibrates only on its named datasets (by default cnn_dailymail, read from the "
                f"Hugging Face hub) with its own sample length: {', '.join(f'calibration.{n}' for n in unused)} not passed",
            )
        )
    fetch = ["git", "clone", "--quiet", "--depth", "1", "--branch", MODELOPT_TAG, MODELOPT_REPOSITORY, str(examples_dir)]
    return QuantizePlan(release.image, release.modelopt, export_dir, examples_dir, fetch, argv, qformat, kv_qformat, notes)
