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


def test_engine_model_refuses_out_of_range_inputs_over_grpc(deployment):
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException, np_to_triton_dtype

    client = grpcclient.InferenceServerClient(deployment.grpc_url)
    cases = [
        ("temperature", np.float32, -1.0, ">= 0"),
        ("runtime_top_p", np.float32, 5.0, "from 0 to 1"),
        ("runtime_top_k", np.int32, -3, "from 0 to"),
        ("end_id", np.int32, 1_000_000, "or -1 for no end token"),
        ("pad_id", np.int32, -2, "from 0 to 49151"),
        ("request_output_len", np.int32, 1_000_000_000, "from 1 to 2047"),
    ]
    for name, dtype, value, valid in cases:
        values = {
            "input_ids": np.array([[504, 3575, 282, 4649, 314]], np.int32),
            "input_lengths": np.array([[5]], np.int32),
            "request_output_len": np.array([[4]], np.int32),
            name: np.array([[value]], dtype),
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
        assert refused, name
        assert isinstance(refused[0], InferenceServerException)
        # A stream's error carries the message only (no status code); the HTTP tests above pin the 400.
        message = refused[0].message()
        assert message.startswith(name) and "outside the valid range" in message and valid in message, message


def test_valid_requests_still_served_after_the_refusals(deployment):
    for model in ("ensemble", "tensorrt_llm_bls"):
        status, doc = http_generate(
            deployment,
            model,
            {"text_input": PROMPT, "max_tokens": 4, "temperature": 0.0, "top_p": 1.0, "top_k": 1, "end_id": -1, "pad_id": 2},
        )
        assert status == 200 and doc["text_output"], doc
