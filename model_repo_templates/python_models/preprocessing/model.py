"""Triton python model `preprocessing`: prompt strings -> token ids (TensorRT-LLM 1.2 tensor contract).

Written for trtllm-forge. Runs inside the Triton python stub: imports only numpy, transformers,
triton_python_backend_utils and the stdlib (plus tokenizer_loading.py copied next to this file).
No chat template is applied: raw text in, raw ids out.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils
from request_checks import check_request, triton_error
from tokenizer_loading import as_bool, load_tokenizer, model_parameters, single_token_id


def to_word_list(words_per_item: list[list[bytes]], tokenizer: Any) -> np.ndarray:
    """Strings per batch item -> INT32 [batch, 2, n]: row 0 the concatenated ids, row 1 the end offsets
    (padded with -1)."""
    rows = []
    for words in words_per_item:
        ids: list[int] = []
        offsets: list[int] = []
        for word in words:
            text = word.decode("utf-8") if isinstance(word, bytes) else str(word)
            if not text:
                continue
            word_ids = tokenizer.encode(text, add_special_tokens=False)
            if not word_ids:
                continue
            ids.extend(word_ids)
            offsets.append(len(ids))
        rows.append((ids, offsets))
    width = max([len(ids) for ids, _ in rows] + [0])
    out = np.zeros((len(rows), 2, width), dtype=np.int32)
    out[:, 1, :] = -1
    for index, (ids, offsets) in enumerate(rows):
        out[index, 0, : len(ids)] = ids
        out[index, 1, : len(offsets)] = offsets
    return out


def optional_input(request: Any, name: str) -> np.ndarray | None:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy()


def strings_per_item(array: np.ndarray | None, batch: int) -> list[list[bytes]]:
    if array is None:
        return [[] for _ in range(batch)]
    return [[w for w in np.asarray(array[i]).reshape(-1)] for i in range(batch)]


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        model_config = json.loads(args["model_config"])
        params = model_parameters(model_config)
        self.tokenizer = load_tokenizer(params)
        self.add_special_tokens = as_bool(params, "add_special_tokens", True)
        self.end_id = single_token_id(self.tokenizer, self.tokenizer.eos_token)
        if self.end_id is None:
            self.end_id = int(self.tokenizer.eos_token_id or 0)
        self.pad_id = single_token_id(self.tokenizer, self.tokenizer.pad_token)
        if self.pad_id is None:
            self.pad_id = self.end_id
        self.vocab_size = len(self.tokenizer)

    def execute(self, requests: list[Any]) -> list[Any]:
        responses = []
        for request in requests:
            try:
                responses.append(pb_utils.InferenceResponse(output_tensors=self._tensors(request)))
            except Exception as exc:  # one bad request must not fail the others
                responses.append(pb_utils.InferenceResponse(error=triton_error(pb_utils, exc, "preprocessing")))
        return responses

    def _encode(self, texts: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
        encoded = [
            self.tokenizer.encode(t.decode("utf-8") if isinstance(t, bytes) else str(t), add_special_tokens=self.add_special_tokens)
            for t in texts
        ]
        lengths = np.array([[len(ids)] for ids in encoded], dtype=np.int32)
        width = max(int(lengths.max()) if len(encoded) else 0, 1)
        ids = np.full((len(encoded), width), self.pad_id, dtype=np.int32)
        for index, row in enumerate(encoded):
            ids[index, : len(row)] = row
        return ids, lengths

    def _tensors(self, request: Any) -> list[Any]:
        check_request(lambda name: optional_input(request, name), "preprocessing", vocab_size=self.vocab_size)
        query = optional_input(request, "QUERY")
        output_len_input = optional_input(request, "REQUEST_OUTPUT_LEN")
        # Required inputs in config.pbtxt: Triton refuses a request without them before it gets here.
        assert query is not None and output_len_input is not None
        batch = query.shape[0]
        input_ids, input_lengths = self._encode([np.asarray(query[i]).reshape(-1)[0] for i in range(batch)])

        decoder_query = optional_input(request, "DECODER_QUERY")
        if decoder_query is not None:
            decoder_ids, decoder_lengths = self._encode([np.asarray(decoder_query[i]).reshape(-1)[0] for i in range(batch)])
        else:
            # Decoder-only models: a one-pad placeholder, as the engine model expects some value here.
            decoder_ids = np.full((batch, 1), self.pad_id, dtype=np.int32)
            decoder_lengths = np.ones((batch, 1), dtype=np.int32)

        output_len = output_len_input.astype(np.int32).reshape(batch, -1)
        bad_words = to_word_list(strings_per_item(optional_input(request, "BAD_WORDS_DICT"), batch), self.tokenizer)
        stop_words = to_word_list(strings_per_item(optional_input(request, "STOP_WORDS_DICT"), batch), self.tokenizer)
        bias = self._embedding_bias(
            strings_per_item(optional_input(request, "EMBEDDING_BIAS_WORDS"), batch),
            optional_input(request, "EMBEDDING_BIAS_WEIGHTS"),
            batch,
        )
        end_id = optional_input(request, "END_ID")
        pad_id = optional_input(request, "PAD_ID")
        end_ids = np.full((batch, 1), self.end_id, np.int32) if end_id is None else end_id.astype(np.int32).reshape(batch, 1)
        pad_ids = np.full((batch, 1), self.pad_id, np.int32) if pad_id is None else pad_id.astype(np.int32).reshape(batch, 1)
        extra = optional_input(request, "PROMPT_TABLE_EXTRA_ID")
        if extra is None:
            extra_ids = np.zeros((batch, 0), dtype=np.uint64)
        else:
            extra_ids = np.repeat(extra.astype(np.uint64).reshape(batch, 1), input_ids.shape[1], axis=1)

        return [
            pb_utils.Tensor("INPUT_ID", input_ids),
            pb_utils.Tensor("REQUEST_INPUT_LEN", input_lengths),
            pb_utils.Tensor("DECODER_INPUT_ID", decoder_ids),
            pb_utils.Tensor("REQUEST_DECODER_INPUT_LEN", decoder_lengths),
            pb_utils.Tensor("BAD_WORDS_IDS", bad_words),
            pb_utils.Tensor("STOP_WORDS_IDS", stop_words),
            pb_utils.Tensor("EMBEDDING_BIAS", bias),
            pb_utils.Tensor("REQUEST_OUTPUT_LEN", output_len),
            pb_utils.Tensor("OUT_END_ID", end_ids),
            pb_utils.Tensor("OUT_PAD_ID", pad_ids),
            pb_utils.Tensor("OUT_PROMPT_TABLE_EXTRA_IDS", extra_ids),
        ]

    def _embedding_bias(self, words_per_item: list[list[bytes]], weights: np.ndarray | None, batch: int) -> np.ndarray:
        if weights is None or not any(words_per_item):
            return np.zeros((batch, 0), dtype=np.float32)
        bias = np.zeros((batch, self.vocab_size), dtype=np.float32)
        for index, words in enumerate(words_per_item):
            item_weights = np.asarray(weights[index]).reshape(-1)
            for word, weight in zip(words, item_weights, strict=False):
                text = word.decode("utf-8") if isinstance(word, bytes) else str(word)
                ids = self.tokenizer.encode(text, add_special_tokens=False)
                if ids:
                    bias[index, ids[0]] += float(weight)
        return bias
