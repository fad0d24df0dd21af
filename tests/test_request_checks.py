"""Served requests out of range are refused with a 400-class error naming the input and its valid range,
on a real Triton serving the rendered cpu repository with the real OpenVINO engine, through every entry
point (ensemble, BLS, engine model), over HTTP and gRPC with NVIDIA's tritonclient."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import numpy as np
import pytest

pytestmark = pytest.mark.slow

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def deployment(cpu_deployment):
    """The session's shared deployment of configs/smollm2-cpu.yaml (refused requests change nothing in it)."""
    return cpu_deployment


def http_generate(deployment, model: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(
        f"{deployment.http_url}/v2/models/{model}/generate",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


# (extra body fields, input named in the error, words of the valid range)
TEXT_CASES = [
    ({"temperature": -1.0, "top_k": 5}, "temperature", ">= 0"),
    ({"temperature": float("nan"), "top_k": 5}, "temperature", ">= 0"),
    ({"top_p": 5.0}, "top_p", "from 0 to 1"),
    ({"top_k": -3}, "top_k", "from 0 to"),
    ({"end_id": 1_000_000}, "end_id", "from 0 to 49151, or -1"),
    ({"end_id": -5}, "end_id", "or -1 for no end token"),
    ({"pad_id": -1}, "pad_id", "from 0 to 49151"),
    ({"embedding_bias_words": ["Paris", "London", "Rome"], "embedding_bias_weights": [1.0, 2.0]}, "embedding_bias", "one weight per word"),
    ({"max_tokens": 1_000_000_000}, "max_tokens", "from 1 to 2047"),
]


def body_of(extra: dict) -> dict:
    # json.dumps writes NaN, which Triton's HTTP frontend (rapidjson) reads as a number.
    return {"text_input": PROMPT, "max_tokens": 8, "stream": False, **extra}


@pytest.mark.parametrize("model", ["ensemble", "tensorrt_llm_bls"])
@pytest.mark.parametrize("extra,name,valid", TEXT_CASES, ids=[f"{n}={next(iter(e.values()))!r}"[:30] for e, n, _ in TEXT_CASES])
def test_text_entry_points_refuse_out_of_range_inputs_with_400(deployment, model, extra, name, valid):
    status, doc = http_generate(deployment, model, body_of(extra))
    assert status == 400, (status, doc)
    assert name.split("_")[0] in doc["error"].lower() and valid in doc["error"], doc


def engine_stream_error(deployment, extra: dict[str, np.ndarray]) -> str | None:
    """The error message the engine model streams back for a prompt plus `extra` inputs (None: served)."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException, np_to_triton_dtype

    client = grpcclient.InferenceServerClient(deployment.grpc_url)
    values = {
        "input_ids": np.array([[504, 3575, 282, 4649, 314]], np.int32),
        "input_lengths": np.array([[5]], np.int32),
        "request_output_len": np.array([[4]], np.int32),
        **extra,
    }
    inputs = []
    for key, array in values.items():
        tensor = grpcclient.InferInput(key, list(array.shape), np_to_triton_dtype(array.dtype))
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    errors: list = []
    client.start_stream(callback=lambda result, error, errors=errors: errors.append(error))
    client.async_stream_infer("tensorrt_llm", inputs, enable_empty_final_response=True)
    client.stop_stream()
    refused = [e for e in errors if e is not None]
    if not refused:
        return None
    assert isinstance(refused[0], InferenceServerException)
    # A stream's error carries the message only (no status code); the HTTP tests above pin the 400.
    return refused[0].message()


def test_engine_model_refuses_out_of_range_inputs_over_grpc(deployment):
    cases = [
        ("temperature", np.float32, -1.0, ">= 0"),
        ("runtime_top_p", np.float32, 5.0, "from 0 to 1"),
        ("runtime_top_k", np.int32, -3, "from 0 to"),
        ("end_id", np.int32, 1_000_000, "or -1 for no end token"),
        ("pad_id", np.int32, -2, "from 0 to 49151"),
        ("request_output_len", np.int32, 1_000_000_000, "from 1 to 2047"),
    ]
    for name, dtype, value, valid in cases:
        message = engine_stream_error(deployment, {name: np.array([[value]], dtype)})
        assert message is not None, name
        assert message.startswith(name) and "outside the valid range" in message and valid in message, message


# Issue #35.5: NVIDIA's word-list layout [batch, 2, N] (row 0 the ids, row 1 cumulative end offsets padded with -1).
# Each of these was served (the offsets ignored past the first -1 or past the end) before the check.
BAD_WORD_LISTS = [
    ([[[5, 6, 7], [2, 3, 0]]], "end offsets [2, 3, 0]"),  # decreasing: 0 after 3
    ([[[5, 6, 7], [1, -1, 9]]], "end offsets [1, -1, 9]"),  # an offset after the -1 padding began
    ([[[5, 6, 7], [4, -1, -1]]], "end offsets [4, -1, -1]"),  # past the end of row 0
    ([[[5, 6, 7], [-2, -1, -1]]], "end offsets [-2, -1, -1]"),
    ([[[5, 6, 10**6], [3, -1, -1]]], "outside 0 to 49151"),
]


@pytest.mark.parametrize(
    "words,problem", BAD_WORD_LISTS, ids=[str(w[0][1]) + ("" if i < 4 else "-ids") for i, (w, _) in enumerate(BAD_WORD_LISTS)]
)
def test_engine_model_refuses_a_stop_words_list_it_cannot_honour(deployment, words, problem):
    message = engine_stream_error(deployment, {"stop_words_list": np.array(words, np.int32)})
    assert message is not None and message.startswith("stop_words_list: ") and problem in message, message


def test_engine_model_serves_a_well_formed_stop_words_list(deployment):
    assert engine_stream_error(deployment, {"stop_words_list": np.array([[[5, 6, 7], [1, 3, -1]]], np.int32)}) is None


def test_valid_requests_still_served_after_the_refusals(deployment):
    for model in ("ensemble", "tensorrt_llm_bls"):
        status, doc = http_generate(
            deployment,
            model,
            {"text_input": PROMPT, "max_tokens": 4, "temperature": 0.0, "top_p": 1.0, "top_k": 1, "end_id": -1, "pad_id": 2},
        )
        assert status == 200 and doc["text_output"], doc
