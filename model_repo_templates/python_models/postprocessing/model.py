"""Triton python model `postprocessing`: output ids -> text (TensorRT-LLM 1.2 tensor contract).

Written for trtllm-forge. Runs inside the Triton python stub: imports only numpy, transformers,
triton_python_backend_utils and the stdlib (plus the helpers copied next to this file).

The ensemble calls this model once per engine response and gives it no request identity, so it cannot
keep state between the pieces of one stream. It decodes each piece after an anchor token instead, which
keeps word-leading spaces (SentencePiece would strip them from a piece decoded alone); the text of
a streamed request therefore concatenates to the same text as the non-streamed one as long as the engine
sends pieces that end on character boundaries. For exact streaming with any engine use the BLS model,
which detokenizes incrementally per request.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils
from forge_detokenize import anchored_decode
from tokenizer_loading import as_bool, load_tokenizer, model_parameters


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        params = model_parameters(json.loads(args["model_config"]))
        self.tokenizer = load_tokenizer(params)
        self.skip_special_tokens = as_bool(params, "skip_special_tokens", True)
        self.anchor = self.tokenizer.encode("a", add_special_tokens=False)[-1:]
        self.anchor_text = self.tokenizer.decode(self.anchor, skip_special_tokens=self.skip_special_tokens)

    def execute(self, requests: list[Any]) -> list[Any]:
        responses = []
        for request in requests:
            try:
                tokens = pb_utils.get_input_tensor_by_name(request, "TOKENS_BATCH").as_numpy()
                lengths = pb_utils.get_input_tensor_by_name(request, "SEQUENCE_LENGTH").as_numpy()
                responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT", self._decode(tokens, lengths))]))
            except Exception as exc:  # one bad request must not fail the others
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(f"postprocessing: {exc}")))
        return responses

    def _decode(self, tokens: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """tokens [batch, beams, tokens], lengths [batch, beams] -> OUTPUT, one string per (batch item, beam).

        OUTPUT is 1-D ([batch * beams], batch-major) like NVIDIA's postprocessing, so the ensemble's
        `text_output` is 1-D too and clients read `as_numpy("text_output")[0].decode()`.
        """
        if tokens.ndim == 2:
            tokens = tokens[:, None, :]
        lengths = lengths.reshape(tokens.shape[0], -1)
        texts = []
        for b in range(tokens.shape[0]):
            for beam in range(tokens.shape[1]):
                ids = tokens[b, beam, : int(lengths[b, beam])].tolist()
                texts.append(anchored_decode(self.tokenizer, ids, self.anchor, self.skip_special_tokens, self.anchor_text).encode("utf-8"))
        return np.array(texts, dtype=object)
