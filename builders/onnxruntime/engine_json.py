"""The engine directory's files beside the ONNX model: config.json in TensorRT-LLM's shape (render reads only
that) and the serving limits written into genai_config.json (what onnxruntime_genai reads).

The model builder writes no Hugging Face config.json; the checkpoint's is kept beside the model as hf_config.json.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from trtllm_forge.builders.onnxruntime.engine import ENGINE
from trtllm_forge.builders.onnxruntime.plan import BACKEND, OrtExportPlan
from trtllm_forge.builders.openvino.engine_json import build_config as openvino_build_config
from trtllm_forge.builders.openvino.engine_json import pretrained_config

from trtllm_forge.config import ForgeConfig
from trtllm_forge.engine_config import write_engine_config

HF_CONFIG_COPY = "hf_config.json"
GENAI_CONFIG = "genai_config.json"


def build_config(config: ForgeConfig) -> dict:
    """TensorRT-LLM's build_config for this engine: the OpenVINO engine's limits, with ONNX Runtime GenAI's cache.
    Its CPU engine keeps one contiguous KV buffer of max_seq_len per sequence (not paged), so prefix reuse and
    chunked context are off, and speculative decoding is not served."""
    build = openvino_build_config(config)
    build["kv_cache_type"] = "CONTINUOUS"
    build["speculative_decoding_mode"] = "NONE"
    build["max_draft_len"] = 0
    build["plugin_config"].update({"paged_kv_cache": False, "use_paged_context_fmha": False})
    return build


def set_serving_limits(engine_dir: Path, config: ForgeConfig) -> None:
    """genai_config.json: every sequence's KV buffer holds max_seq_len tokens (the builder's default is the model's
    whole context, which would reserve GBs per sequence), and the engine batches up to max_batch_size requests."""
    path = engine_dir / GENAI_CONFIG
    genai = json.loads(path.read_text())
    genai.setdefault("search", {})["max_length"] = config.engine.max_seq_len
    genai.setdefault("engine", {})["static_batching"] = {"max_batch_size": config.engine.max_batch_size}
    path.write_text(json.dumps(genai, indent=4) + "\n")


def write(engine_dir: Path, checkpoint_dir: Path, config: ForgeConfig, plan: OrtExportPlan, genai_version: str, tools: dict) -> Path:
    shutil.copy2(checkpoint_dir / "config.json", engine_dir / HF_CONFIG_COPY)
    hf = json.loads((engine_dir / HF_CONFIG_COPY).read_text())
    set_serving_limits(engine_dir, config)
    # The shape fields are the OpenVINO engine's; the plan gives the same dtype/quant_algo/group_size attributes.
    pretrained = pretrained_config(hf, plan)  # type: ignore[arg-type]
    return write_engine_config(
        engine_dir,
        version=genai_version,
        engine=ENGINE,
        pretrained_config=pretrained,
        build_config=build_config(config),
        extra={
            BACKEND: {
                "precision": plan.precision,
                "block_size": plan.block_size,
                "accuracy_level": plan.accuracy_level,
                "export_argv": plan.argv,
                "genai_config": GENAI_CONFIG,
                "hf_config": HF_CONFIG_COPY,
                "tool_versions": tools,
            }
        },
    )
