"""The built ONNX Runtime GenAI engine loaded in-process (onnxruntime_genai), for its perplexity on a local text.

A generator's prefill of a window returns the decoder's logits for every position of it
(`Generator.get_output("logits")`, [1, tokens, vocab]; `get_logits()` keeps only the last position), so the
engine's own (int4/int8) weights are scored on the same windows and the same tokens as the reference model.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from trtllm_forge.errors import StepError
from trtllm_forge.verify.reference import PERPLEXITY_WINDOW, Perplexity, text_perplexity


def summed_nll(logits: np.ndarray, targets: Sequence[int]) -> float:
    """Summed negative log-likelihood of `targets` under row-wise softmax(`logits`) ([len(targets), vocab])."""
    rows = np.asarray(logits, dtype=np.float64)
    top = rows.max(axis=-1)
    log_norm = top + np.log(np.exp(rows - top[:, None]).sum(axis=-1))
    return float((log_norm - rows[np.arange(len(targets)), np.asarray(targets)]).sum())


class OnnxRuntimeEngineModel:
    """The engine directory's model.onnx and the tokenizer files the builder copied beside it."""

    def __init__(self, engine_dir: Path) -> None:
        import onnxruntime_genai as og
        from transformers import AutoTokenizer

        self.engine_dir = Path(engine_dir)
        self.tokenizer: Any = AutoTokenizer.from_pretrained(str(self.engine_dir))
        self._og = og
        self.model = og.Model(str(self.engine_dir))

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text)["input_ids"])

    def window_nll(self, ids: Sequence[int]) -> float:
        """Summed negative log-likelihood of ids[1:], from one prefill of `ids` in a fresh generator."""
        params = self._og.GeneratorParams(self.model)
        params.set_search_options(max_length=len(ids) + 1)
        generator = self._og.Generator(self.model, params)
        generator.append_tokens(np.asarray([list(ids)], dtype=np.int32))
        logits = np.asarray(generator.get_output("logits"))
        if logits.ndim != 3 or logits.shape[1] != len(ids):
            raise StepError(
                "verify",
                f"the ONNX Runtime engine in {self.engine_dir} returned logits of shape {list(logits.shape)} for a "
                f"prefill of {len(ids)} tokens; perplexity needs one row per token",
                "rebuild the engine with `trtllm-forge build-engine CONFIG --force`",
            )
        return summed_nll(logits[0, :-1], ids[1:])

    def perplexity(self, text: str | None = None, window: int = PERPLEXITY_WINDOW) -> Perplexity:
        return text_perplexity(self.encode, self.window_nll, text, window)
