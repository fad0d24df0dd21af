"""Range checks of a served request's inputs, shared by the preprocessing, BLS and CPU `tensorrt_llm` models.

Written for trtllm-forge; copied next to each model that uses it (numpy and the standard library only:
it runs in the Triton python stub). A request with temperature -1 or NaN, top_p 5, top_k -3, an end_id
no token has, a negative pad_id, three bias words with two weights or a max_tokens the engine can never
produce is refused with INVALID_ARG (HTTP 400, gRPC INVALID_ARGUMENT) naming the input and its valid
range, instead of being served as something else than what was asked.

Ranges follow TensorRT-LLM's sampling semantics: temperature >= 0 (0 = greedy), top_p in [0, 1], top_k >= 0
(0 = no top-k), end_id -1 = no end token (generate to the requested length), otherwise ids in [0, vocab).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np

END_ID_NONE = -1


class InvalidInput(ValueError):
    """A request input outside its valid range (the client's error, not the server's)."""


# rule -> the input's name at each model (the same rule has different names in each tensor contract)
INPUT_NAMES: dict[str, dict[str, str]] = {
    "preprocessing": {
        "output_len": "REQUEST_OUTPUT_LEN",
        "end_id": "END_ID",
        "pad_id": "PAD_ID",
        "bias_words": "EMBEDDING_BIAS_WORDS",
        "bias_weights": "EMBEDDING_BIAS_WEIGHTS",
    },
    "tensorrt_llm_bls": {
        "output_len": "max_tokens",
        "end_id": "end_id",
        "pad_id": "pad_id",
        "temperature": "temperature",
        "top_p": "top_p",
        "top_k": "top_k",
        "repetition_penalty": "repetition_penalty",
        "presence_penalty": "presence_penalty",
        "frequency_penalty": "frequency_penalty",
        "length_penalty": "length_penalty",
        "min_tokens": "min_tokens",
        "seed": "seed",
        "bias_words": "embedding_bias_words",
        "bias_weights": "embedding_bias_weights",
    },
    "tensorrt_llm": {
        "output_len": "request_output_len",
        "end_id": "end_id",
        "pad_id": "pad_id",
        "temperature": "temperature",
        "top_p": "runtime_top_p",
        "top_k": "runtime_top_k",
        "repetition_penalty": "repetition_penalty",
        "presence_penalty": "presence_penalty",
        "frequency_penalty": "frequency_penalty",
        "length_penalty": "len_penalty",
        "min_tokens": "min_tokens",
        "seed": "seed",
        "embedding_bias": "embedding_bias",
        "stop_words": "stop_words_list",
        "bad_words": "bad_words_list",
    },
}
# What a client of the ensemble calls the engine model's inputs (the ensemble maps them through unchanged).
ENSEMBLE_NAMES = {"runtime_top_p": "top_p", "runtime_top_k": "top_k", "request_output_len": "max_tokens", "len_penalty": "length_penalty"}


def _shown(name: str) -> str:
    alias = ENSEMBLE_NAMES.get(name)
    return f"{name} ({alias} at the ensemble)" if alias else name


def _numbers(name: str, array: np.ndarray | None) -> np.ndarray | None:
    if array is None:
        return None
    values = np.asarray(array).reshape(-1)
    if values.size == 0:
        return None
    if values.dtype.kind not in "biuf":
        raise InvalidInput(f"{_shown(name)}: {values[0]!r} is not a number")
    return values


def _each(name: str, values: np.ndarray, valid: Callable[[Any], bool], range_text: str) -> None:
    for value in values.tolist():
        if (isinstance(value, float) and not math.isfinite(value)) or not valid(value):
            raise InvalidInput(f"{_shown(name)}: {value!r} is outside the valid range; {range_text}")


def _whole(name: str, values: np.ndarray, range_text: str) -> None:
    if values.dtype.kind == "f":
        _each(name, values, lambda v: float(v).is_integer(), range_text)


def check_request(
    get: Callable[[str], np.ndarray | None], model: str, vocab_size: int | None = None, max_output_len: int | None = None
) -> None:
    """Raise InvalidInput for the first input of this request outside its range.

    get(name) -> the input's numpy array or None; model: a key of INPUT_NAMES; vocab_size: ids must be
    below it; max_output_len: the most tokens the engine can ever generate (max_seq_len - 1)."""
    names = INPUT_NAMES[model]

    def values(rule: str) -> tuple[str, np.ndarray | None]:
        name = names.get(rule)
        return (name, _numbers(name, get(name))) if name is not None else ("", None)

    name, v = values("temperature")
    if v is not None:
        _each(name, v, lambda x: x >= 0, "a finite number >= 0 (0 = greedy)")
    name, v = values("top_p")
    if v is not None:
        _each(name, v, lambda x: 0 <= x <= 1, "a number from 0 to 1")
    name, v = values("top_k")
    if v is not None:
        top_k_range = f"a whole number from 0 to {vocab_size} (0 = no top-k)" if vocab_size else "a whole number >= 0 (0 = no top-k)"
        _whole(name, v, top_k_range)
        _each(name, v, lambda x: x >= 0 and (vocab_size is None or x <= vocab_size), top_k_range)
    name, v = values("repetition_penalty")
    if v is not None:
        _each(name, v, lambda x: x > 0, "a finite number > 0 (1 = no penalty)")
    for rule in ("presence_penalty", "frequency_penalty", "length_penalty"):
        name, v = values(rule)
        if v is not None:
            _each(name, v, lambda x: True, "a finite number")
    for rule in ("min_tokens", "seed"):
        name, v = values(rule)
        if v is not None:
            _whole(name, v, "a whole number >= 0")
            _each(name, v, lambda x: x >= 0, "a whole number >= 0")
    ids = f"from 0 to {vocab_size - 1}" if vocab_size else ">= 0"
    name, v = values("end_id")
    if v is not None:
        text = f"a token id {ids}, or {END_ID_NONE} for no end token"
        _whole(name, v, text)
        _each(name, v, lambda x: x == END_ID_NONE or (x >= 0 and (vocab_size is None or x < vocab_size)), text)
    name, v = values("pad_id")
    if v is not None:
        _whole(name, v, f"a token id {ids}")
        _each(name, v, lambda x: x >= 0 and (vocab_size is None or x < vocab_size), f"a token id {ids}")
    name, v = values("output_len")
    if v is not None:
        text = f"a whole number from 1 to {max_output_len}" if max_output_len else "a whole number >= 1"
        if max_output_len:
            text += " (the engine's max_seq_len holds the prompt and the output)"
        _whole(name, v, text)
        _each(name, v, lambda x: x >= 1 and (max_output_len is None or x <= max_output_len), text)
    if "bias_words" in names:
        _check_bias_lists(names["bias_words"], get(names["bias_words"]), names["bias_weights"], get(names["bias_weights"]))
    for rule in ("stop_words", "bad_words"):
        if rule in names:
            _check_word_list(names[rule], get(names[rule]), vocab_size)
    if "embedding_bias" in names:
        name, v = values("embedding_bias")
        if v is not None:
            _each(name, v, lambda x: True, "finite numbers")


def _check_bias_lists(words_name: str, words: np.ndarray | None, weights_name: str, weights: np.ndarray | None) -> None:
    word_rows = _rows(words)
    weight_rows = _rows(weights)
    if not any(len(row) for row in word_rows) and not any(len(row) for row in weight_rows):
        return
    if len(word_rows) != len(weight_rows) or any(len(a) != len(b) for a, b in zip(word_rows, weight_rows, strict=False)):
        counts = f"{[len(r) for r in word_rows]} words and {[len(r) for r in weight_rows]} weights"
        raise InvalidInput(f"{words_name}/{weights_name}: {counts} per batch item; send one weight per word")
    flat = _numbers(weights_name, weights)
    if flat is not None:
        _each(weights_name, flat, lambda x: True, "finite numbers")


WORD_LIST_LAYOUT = "[batch, 2, N]: row 0 the words' token ids one after another, row 1 each word's end offset into row 0 (increasing, at most N), padded with -1"


def _check_word_list(name: str, array: np.ndarray | None, vocab_size: int | None) -> None:
    """TensorRT-LLM's word-list layout (stop_words_list, bad_words_list), as NVIDIA's preprocessing writes it: an
    offset past the end of row 0, a decreasing one or a negative one before the -1 padding ends is refused."""
    if array is None or np.asarray(array).size == 0:
        return
    items = np.asarray(array)
    if items.ndim == 2:
        items = items.reshape(1, *items.shape)
    if items.ndim != 3 or items.shape[1] != 2 or items.dtype.kind not in "iu":
        raise InvalidInput(f"{name}: shape {list(np.asarray(array).shape)} of {items.dtype}; send INT32 {WORD_LIST_LAYOUT}")
    width = items.shape[2]
    for index, (ids, offsets) in enumerate(items.tolist()):
        used = offsets[: offsets.index(-1)] if -1 in offsets else offsets
        if any(o != -1 for o in offsets[len(used) :]) or any(o < 0 or o > width for o in used) or used != sorted(used):
            raise InvalidInput(f"{name}: end offsets {offsets} of batch item {index} do not fit {ids}; send {WORD_LIST_LAYOUT}")
        end = used[-1] if used else 0
        if vocab_size and any(not 0 <= t < vocab_size for t in ids[:end]):
            raise InvalidInput(f"{name}: token ids {ids[:end]} of batch item {index} are outside 0 to {vocab_size - 1}")


def _rows(array: np.ndarray | None) -> list[list]:
    if array is None:
        return []
    array = np.asarray(array)
    if array.ndim <= 1:
        return [array.reshape(-1).tolist()]
    return [np.asarray(row).reshape(-1).tolist() for row in array]


def triton_error(pb_utils: ModuleType, exc: BaseException, model: str) -> Any:  # a pb_utils.TritonError
    """The TritonError a client gets for `exc`: INVALID_ARG (HTTP 400) for an invalid input, else INTERNAL."""
    message = f"{model}: {exc}"
    if isinstance(exc, InvalidInput):
        return pb_utils.TritonError(message, pb_utils.TritonError.INVALID_ARG)
    return pb_utils.TritonError(message)


def reraise(pb_utils: ModuleType, error: Any, model: str) -> None:
    """Raise the error another model answered with, keeping an invalid input an invalid input."""
    if error.code() == pb_utils.TritonError.INVALID_ARG:
        raise InvalidInput(error.message())
    raise RuntimeError(f"{model}: {error.message()}")
