"""TensorRT-LLM's own config rules: ONE list, run by config/checks.py's `backend_rules` when a config with
engine.backend tensorrt-llm is loaded (so `config validate` refuses it), and by plan_build (so `build-engine
--dry-run` and `plan` refuse the same configs with the same words). Each rule names the field to change.

- the spec's GPU compute-capability limits of each quantization (quant.py `capability_problems`);
- what trtllm-forge plans a TensorRT-LLM build for (model families, no medusa engines, NVIDIA's EAGLE converter's
  limits, quantize.py without expert parallelism);
- calibration data that never comes from a hub;
- quantize.py's calibration holds the whole unquantized checkpoint on the GPUs of ONE node (it is a single process
  spreading the model over the visible GPUs): a checkpoint larger than a node's GPU memory is refused, with the way
  out (a checkpoint quantized elsewhere, served by the LLM API).
"""

from __future__ import annotations

from collections.abc import Iterator

from trtllm_forge.builders.tensorrt_llm.quant import CONVERT_WEIGHT_ONLY, QuantChoice, capability_problems, choose, plain, sm_of
from trtllm_forge.builders.tensorrt_llm.spec import load_spec

from trtllm_forge.config.checks import CheckContext
from trtllm_forge.config.schema import ForgeConfig
from trtllm_forge.errors import ConfigError
from trtllm_forge.hardware import Device
from trtllm_forge.model_shape import ModelShape

PLANNED_FAMILIES = ("llama", "mistral", "mixtral", "qwen2")
# EAGLE's convert_checkpoint.py quantizes only weight-only (CONVERT_WEIGHT_ONLY, no calibration); the converter reads a
# LlamaConfig and asserts pp_size == 1 (spec convert_checkpoint_eagle).
EAGLE_FAMILIES = ("llama", "mistral")
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
GIB = 1 << 30


def config_problems(ctx: CheckContext) -> Iterator[ConfigError]:
    """Every rule, for config/checks.py (the descriptor's `config_rules`)."""
    cc = ctx.compute_capability
    quant = ctx.config.quantization
    try:
        spec = load_spec(ctx.config.engine.trtllm_version)
        choice = choose(quant.algorithm, quant.kv_cache, spec)
    except ConfigError:
        return  # an unknown version or algorithm is the build's to report
    if cc is not None:
        yield from capability_problems(choice, sm_of(cc), ctx.device_name, spec, plugin_flags={})
    yield from build_refusals(ctx.config, ctx.shape, ctx.device, choice)


def family_of(config: ForgeConfig, shape: ModelShape | None) -> str | None:
    return config.model.family or (shape.model_type if shape else None)


def build_refusals(config: ForgeConfig, shape: ModelShape | None, device: Device | None, choice: QuantChoice) -> list[ConfigError]:
    """What the TensorRT-LLM builder refuses to plan for this config (plan_build raises the same list)."""
    family = family_of(config, shape)
    if family not in PLANNED_FAMILIES:
        return [
            ConfigError(
                "model.family",
                f"cannot plan a TensorRT-LLM conversion for model family {family!r}",
                f"one of {', '.join(PLANNED_FAMILIES)} (set model.family or model.name)",
            )
        ]
    if config.engine.target != "engine":
        return []
    sp = config.engine.speculative
    problems: list[ConfigError] = []
    if plain(sp.mode) == "medusa":
        problems.append(
            ConfigError(
                "engine.speculative.mode",
                "medusa engines (Vicuna-only in 1.2.x) are not planned by trtllm-forge",
                "use eagle, draft_target or lookahead, or engine.target: llmapi",
            )
        )
    if sp.mode == "eagle":
        problems += _eagle_refusals(config, family, choice)
        return problems  # EAGLE's converter quantizes without calibration (plan.py `_eagle_choice`)
    if choice.tool == "quantize.py" and config.parallel.moe_ep is not None:
        problems.append(
            ConfigError(
                "parallel.moe_ep",
                "quantize.py (ModelOpt) cannot set expert parallelism",
                "drop moe_ep/moe_tp for quantized MoE models, or use quantization.algorithm none / int8_wo / int4_wo",
            )
        )
    if choice.needs_calibration and not config.quantization.calibration.dataset:
        problems.append(
            ConfigError(
                "quantization.calibration.dataset",
                f"{choice.algorithm} (KV {choice.kv_cache}) needs calibration data, and quantize.py's default "
                "(cnn_dailymail) is downloaded from a hub at run time",
                'set a local JSONL file (one {"text": ...} per line) or a plain-text file',
            )
        )
    if choice.tool == "quantize.py":
        problems += _quantize_fits_one_node(config, shape, device)
    return problems


def _eagle_refusals(config: ForgeConfig, family: str, choice: QuantChoice) -> list[ConfigError]:
    """What NVIDIA's EAGLE converter can build: Llama-family models, pp 1, weight-only int8/int4 or no quantization."""
    problems = []
    if family not in EAGLE_FAMILIES:
        problems.append(
            ConfigError(
                "engine.speculative.mode",
                "eagle on the engine target reads the base model as a LlamaConfig (TensorRT-LLM 1.2.x "
                f"examples/eagle/convert_checkpoint.py), which a {family} model is not",
                "use engine.target: llmapi for EAGLE with this model, or another speculative mode (draft_target, lookahead)",
            )
        )
    if config.parallel.pp > 1:
        problems.append(
            ConfigError(
                "parallel.pp",
                f"NVIDIA's EAGLE converter asserts pp_size == 1 (got {config.parallel.pp})",
                "use tensor parallelism only (pp: 1) with eagle",
            )
        )
    if choice.quant_algo is not None and choice.algorithm not in CONVERT_WEIGHT_ONLY:
        problems.append(
            ConfigError(
                "quantization.algorithm",
                f"NVIDIA's EAGLE converter quantizes only weight-only int8/int4 without calibration; {choice.algorithm} cannot be applied",
                f"one of none, {', '.join(CONVERT_WEIGHT_ONLY)}, or engine.target: llmapi with a pre-quantized checkpoint",
            )
        )
    return problems


def checkpoint_bytes(config: ForgeConfig, shape: ModelShape) -> int:
    """Bytes of the unquantized checkpoint: its parameters in model.dtype (bfloat16 when auto)."""
    from trtllm_forge.plan.weights import parameter_count

    return parameter_count(shape) * DTYPE_BYTES.get(config.model.dtype, 2)


def _quantize_fits_one_node(config: ForgeConfig, shape: ModelShape | None, device: Device | None) -> list[ConfigError]:
    if shape is None or device is None or not device.is_gpu:
        return []
    gpus = min(config.parallel.gpus_per_node, config.hardware.count or config.parallel.gpus_per_node)
    node_bytes = gpus * device.memory_gb * GIB
    weights = checkpoint_bytes(config, shape)
    if weights <= node_bytes:
        return []
    return [
        ConfigError(
            "quantization.algorithm",
            f"{config.quantization.algorithm} is calibrated by quantize.py, which loads the whole unquantized checkpoint "
            f"({weights / 1e9:,.0f} GB) onto the GPUs of one node ({gpus} x {device.name} = {node_bytes / GIB:,.0f} GiB): it does not fit",
            "start from a checkpoint quantized elsewhere (e.g. a TensorRT Model Optimizer FP8 export) with engine.target: llmapi, "
            "or quantize on a node with more GPU memory",
        )
    ]
