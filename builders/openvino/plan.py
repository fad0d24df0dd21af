"""What an OpenVINO build will do, decided from the config alone: weight format, precision hints and the
export command. Kept free of side effects so `--dry-run` and the real build share one source of truth.

Quantization mapping (`quantization.algorithm` → optimum-intel weight compression):
    none      → fp32, or fp16 when the model dtype (trtllm_forge.dtypes) is float16/bfloat16
    int8_wo   → int8 (per-channel, asymmetric: NNCF's int8 default)
    int4_wo   → int4 with `--group-size quantization.group_size`
    int4_awq  → int4 + AWQ. Without a calibration file this is NNCF's data-free AWQ; with
                `quantization.calibration.dataset` (a local text/JSONL file) the export runs through our own
                `calibrated_export` module so AWQ and scale estimation see real activations. Named hub
                datasets are never used: nothing is downloaded.
KV cache precision (`quantization.kv_cache`): none → the activation precision (f32 with the f32 hint,
bf16 with bf16), int8 → u8. bf16 activations with an f32 KV cache are rejected by the CPU plugin.
"""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from trtllm_forge.builders.openvino.engine import KV_QUANT_ALGO_NAMES, QUANT_ALGO_NAMES

from trtllm_forge.config import ForgeConfig
from trtllm_forge.dtypes import resolve_model_dtype
from trtllm_forge.errors import ConfigError

# Files the engine directory must hold after an export; the CPU engine model and GenAI load them.
IR_FILES = ("openvino_model.xml", "openvino_model.bin")
TOKENIZER_IR_FILES = ("openvino_tokenizer.xml", "openvino_detokenizer.xml")


def optimum_cli() -> Path:
    """optimum-cli of the running interpreter's environment (not whatever is first on PATH)."""
    return Path(sys.executable).parent / "optimum-cli"


@dataclass(frozen=True)
class ExportPlan:
    weight_format: str  # fp32 | fp16 | int8 | int4
    dtype: str  # pretrained_config.dtype: the dtype of the unquantized parts
    inference_precision: str  # OpenVINO INFERENCE_PRECISION_HINT: f32 | bf16 | auto
    kv_cache_precision: str  # OpenVINO KV_CACHE_PRECISION: f32 | bf16 | u8 | auto
    quant_algo: str | None
    kv_cache_quant_algo: str | None
    group_size: int | None
    awq: bool
    calibration_file: Path | None
    argv: list[str] = field(default_factory=list)

    def properties(self) -> dict[str, str]:
        """OpenVINO compile properties for the CPU plugin (`auto` leaves the plugin's default)."""
        props = {}
        if self.inference_precision != "auto":
            props["INFERENCE_PRECISION_HINT"] = self.inference_precision
        if self.kv_cache_precision != "auto":
            props["KV_CACHE_PRECISION"] = self.kv_cache_precision
        return props

    def to_json(self) -> dict:
        data = asdict(self)
        data["calibration_file"] = str(self.calibration_file) if self.calibration_file else None
        return data


def plan_export(config: ForgeConfig, checkpoint_dir: Path | None, output_dir: Path) -> ExportPlan:
    quant = config.quantization
    algorithm = str(getattr(quant.algorithm, "value", quant.algorithm))  # the schema default is the enum member
    if algorithm not in QUANT_ALGO_NAMES:
        raise ConfigError(
            "quantization.algorithm",
            f"{algorithm} is not available on the openvino backend",
            f"one of {', '.join(QUANT_ALGO_NAMES)}",
        )
    if quant.kv_cache not in KV_QUANT_ALGO_NAMES:
        raise ConfigError("quantization.kv_cache", f"{quant.kv_cache} is not available on openvino", "use int8 or none")

    dtype = resolve_model_dtype(config, checkpoint_dir)
    weight_format = {"none": "fp16" if dtype in ("float16", "bfloat16") else "fp32", "int8_wo": "int8"}.get(algorithm, "int4")
    inference = config.engine.cpu_inference_precision
    kv_precision = "u8" if quant.kv_cache == "int8" else {"f32": "f32", "bf16": "bf16"}.get(inference, "auto")

    calibration = None
    if quant.calibration.dataset and algorithm == "int4_awq":
        calibration = config.resolve_path(quant.calibration.dataset)
        if not calibration.is_file():
            raise ConfigError(
                "quantization.calibration.dataset",
                f"{calibration} does not exist",
                "give a local text or JSONL file (one sample per line or a 'text' field); nothing is downloaded",
            )
    group_size = quant.group_size if weight_format == "int4" else None
    plan = ExportPlan(
        weight_format=weight_format,
        dtype="float32" if weight_format == "fp32" else ("float16" if weight_format == "fp16" else dtype),
        inference_precision=inference,
        kv_cache_precision=kv_precision,
        quant_algo=QUANT_ALGO_NAMES[algorithm],
        kv_cache_quant_algo=KV_QUANT_ALGO_NAMES[quant.kv_cache],
        group_size=group_size,
        awq=algorithm == "int4_awq",
        calibration_file=calibration,
    )
    return _with_argv(plan, config, checkpoint_dir, output_dir)


# Draft-target speculative decoding: the draft model is exported beside the target, into this subdirectory of
# the engine directory, with int8 weights (a draft only proposes tokens; the target checks every one, so the
# output stays the target's own). A draft_model directory that already holds an OpenVINO IR is copied as is.
DRAFT_SUBDIR = "draft"
DRAFT_WEIGHT_FORMAT = "int8"
# Compile properties the draft gets on top of the target's. The draft of a small model is bound by per-operation
# overhead, not by reading its weights: one thread drafts a token in about 0.4x the target's step where two threads
# (waiting on each other at every operation) took 0.7-0.8x on the 2-core benchmark machine (scripts/bench_cpu_speculative.py
# measures both, in process, in the same run).
DRAFT_PROPERTIES = {"INFERENCE_NUM_THREADS": "1"}


@dataclass(frozen=True)
class DraftPlan:
    source: Path  # the draft checkpoint (HF directory) or an exported OpenVINO IR directory
    output_dir: Path
    num_assistant_tokens: int  # engine.speculative.max_draft_len: tokens drafted per step
    argv: list[str] | None  # the export command; None when `source` already is an IR (copied)

    @property
    def weight_format(self) -> str:
        return DRAFT_WEIGHT_FORMAT if self.argv else "as exported"

    def to_json(self) -> dict:
        return {
            "source": str(self.source),
            "subdir": DRAFT_SUBDIR,
            "weight_format": self.weight_format,
            "num_assistant_tokens": self.num_assistant_tokens,
            "properties": dict(DRAFT_PROPERTIES),
            "argv": self.argv,
        }


def plan_draft_export(config: ForgeConfig, engine_dir: Path) -> DraftPlan | None:
    spec = config.engine.speculative
    if str(getattr(spec.mode, "value", spec.mode)) != "draft_target" or not spec.draft_model:
        return None
    source = config.resolve_path(spec.draft_model)
    output_dir = engine_dir / DRAFT_SUBDIR
    if (source / IR_FILES[0]).is_file():
        return DraftPlan(source, output_dir, spec.max_draft_len, None)
    argv = [str(optimum_cli()), "export", "openvino", "--model", str(source), "--task", "text-generation-with-past"]
    argv += ["--weight-format", DRAFT_WEIGHT_FORMAT]
    if config.model.trust_remote_code:
        argv += ["--trust-remote-code"]
    return DraftPlan(source, output_dir, spec.max_draft_len, [*argv, str(output_dir)])


def _with_argv(plan: ExportPlan, config: ForgeConfig, checkpoint_dir: Path | None, output_dir: Path) -> ExportPlan:
    model = str(checkpoint_dir) if checkpoint_dir else "<checkpoint>"
    if plan.calibration_file is not None:
        calib = config.quantization.calibration
        argv = [
            sys.executable,
            "-m",
            "trtllm_forge.builders.openvino.calibrated_export",
            "--model",
            model,
            "--output",
            str(output_dir),
            "--group-size",
            str(plan.group_size),
            "--dataset",
            str(plan.calibration_file),
            "--num-samples",
            str(calib.size),
            "--seq-len",
            str(calib.seq_len),
        ]
    else:
        argv = [
            str(optimum_cli()),
            "export",
            "openvino",
            "--model",
            model,
            "--task",
            "text-generation-with-past",
            "--weight-format",
            plan.weight_format,
        ]
        if plan.group_size is not None:
            argv += ["--group-size", str(plan.group_size), "--ratio", "1.0"]
        if plan.awq:
            argv += ["--awq"]
        if config.model.trust_remote_code:
            argv += ["--trust-remote-code"]
        argv += [str(output_dir)]
    return ExportPlan(**{**asdict(plan), "calibration_file": plan.calibration_file, "argv": argv})
