"""The built OpenVINO engine loaded in-process (optimum-intel), for its perplexity on a local text."""

from __future__ import annotations

import json
from pathlib import Path

from trtllm_forge.verify.reference import ReferenceModel


class OpenVINOEngineModel(ReferenceModel):
    """Same interface as ReferenceModel (encode, perplexity), backed by the engine directory's IR."""

    def __init__(self, engine_dir: Path, inference_precision: str = "f32") -> None:
        from optimum.intel import OVModelForCausalLM
        from transformers import AutoConfig, AutoTokenizer

        engine_dir = Path(engine_dir)
        # The engine's config.json is ours (TensorRT-LLM's shape); the builder kept the HF one beside it.
        engine_config = json.loads((engine_dir / "config.json").read_text())
        hf_config = engine_dir / engine_config["openvino"]["hf_config"]
        self.checkpoint_dir = engine_dir
        self.tokenizer = AutoTokenizer.from_pretrained(str(engine_dir))
        ov_config = {} if inference_precision == "auto" else {"INFERENCE_PRECISION_HINT": inference_precision}
        self.model = OVModelForCausalLM.from_pretrained(
            str(engine_dir), config=AutoConfig.from_pretrained(str(hf_config)), ov_config=ov_config, compile=True
        )
