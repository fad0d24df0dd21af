"""The engine directory's config.json for an OpenVINO engine, in TensorRT-LLM's shape.

optimum-intel writes the Hugging Face config.json into the export directory; we replace it with the
engine contract (render reads only that) and keep the original beside it as hf_config.json.
"""

from __future__ import annotations

import json
from pathlib import Path

from trtllm_forge.builders.openvino.engine import ENGINE
from trtllm_forge.builders.openvino.plan import DraftPlan, ExportPlan

from trtllm_forge.config import ForgeConfig
from trtllm_forge.engine_config import write_engine_config

HF_CONFIG_COPY = "hf_config.json"

# build_config.speculative_decoding_mode names, as TensorRT-LLM serializes them.
SPECULATIVE_MODES = {"none": "NONE", "draft_target": "DRAFT_TOKENS_EXTERNAL", "prompt_lookup": "DRAFT_TOKENS_EXTERNAL"}


def pretrained_config(hf: dict, plan: ExportPlan) -> dict:
    heads = int(hf["num_attention_heads"])
    architectures = hf.get("architectures") or [""]
    return {
        "architecture": architectures[0],
        "dtype": plan.dtype,
        "logits_dtype": "float32",
        "vocab_size": int(hf["vocab_size"]),
        "num_hidden_layers": int(hf["num_hidden_layers"]),
        "hidden_size": int(hf["hidden_size"]),
        "num_attention_heads": heads,
        "num_key_value_heads": int(hf.get("num_key_value_heads") or heads),
        "head_size": int(hf.get("head_dim") or int(hf["hidden_size"]) // heads),
        "max_position_embeddings": int(hf.get("max_position_embeddings") or 0),
        "mapping": {"world_size": 1, "tp_size": 1, "pp_size": 1},
        "quantization": {
            "quant_algo": plan.quant_algo,
            "kv_cache_quant_algo": plan.kv_cache_quant_algo,
            "group_size": plan.group_size,
        },
    }


def build_config(config: ForgeConfig) -> dict:
    eng = config.engine
    spec = eng.speculative
    return {
        "max_batch_size": eng.max_batch_size,
        "max_beam_width": 1,
        "max_input_len": eng.max_input_len,
        "max_seq_len": eng.max_seq_len,
        "max_num_tokens": eng.resolved_max_num_tokens,
        "kv_cache_type": "PAGED",
        "gather_context_logits": False,
        "gather_generation_logits": False,
        "speculative_decoding_mode": SPECULATIVE_MODES.get(str(spec.mode), "NONE"),
        "max_draft_len": spec.max_draft_len,
        "plugin_config": {
            "paged_kv_cache": True,
            "tokens_per_block": eng.tokens_per_block,
            # Prefix caching and dynamic split-fuse work with OpenVINO's paged attention on CPU.
            "use_paged_context_fmha": True,
            "remove_input_padding": True,
            "lora_plugin": None,
        },
    }


def write(
    engine_dir: Path, config: ForgeConfig, plan: ExportPlan, genai_version: str, tool_versions: dict, draft: DraftPlan | None = None
) -> Path:
    hf_path = engine_dir / "config.json"
    hf = json.loads(hf_path.read_text())
    hf_path.rename(engine_dir / HF_CONFIG_COPY)
    return write_engine_config(
        engine_dir,
        version=genai_version,
        engine=ENGINE,
        pretrained_config=pretrained_config(hf, plan),
        build_config=build_config(config),
        extra={
            ENGINE.backend: {
                "weight_format": plan.weight_format,
                "inference_precision": plan.inference_precision,
                "kv_cache_precision": plan.kv_cache_precision,
                "properties": plan.properties(),
                "awq": plan.awq,
                "calibration_file": str(plan.calibration_file) if plan.calibration_file else None,
                "export_argv": plan.argv,
                "hf_config": HF_CONFIG_COPY,
                "tool_versions": tool_versions,
                # read by the CPU engine model: the draft model of draft-target speculative decoding
                "draft": draft.to_json() if draft else None,
            }
        },
    )
