"""The LLM API path for real on CPU: `trtllm-forge run configs/smollm2-cpu-llmapi.yaml` (import and build: the
session's, reused → render → deploy → smoke → verify exact vs transformers → bench) with the unmodified llmapi model.py inside the
real Triton, its `tensorrt_llm` being trtllm-forge's CPU stand-in; then NVIDIA's llmapi inputs against the kept
server, with the stand-in engine's own counters to prove that a vanished client stops the generation."""

from __future__ import annotations

import itertools
import json
import queue
import threading
import time

import numpy as np
import pytest
from chain_helpers import assert_chain_passed, kept_run, run_document
from conftest import CONFIGS

from trtllm_forge.client import stream_request
from trtllm_forge.llmapi_cpu.llm import STATS_ENV

pytestmark = pytest.mark.slow
PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def served(tmp_path_factory, imported_smollm2, cpu_engine_llmapi, chain_host_profile):
    root = tmp_path_factory.mktemp("llmapi-e2e")
    stats = root / "engine-stats.json"
    stages = [imported_smollm2.parent, cpu_engine_llmapi[0] / "build"]  # the session's import and llmapi build, reused
    with kept_run(root, CONFIGS / "smollm2-cpu-llmapi.yaml", stages, chain_host_profile, env={STATS_ENV: str(stats)}) as (workdir, proc):
        yield workdir, proc, stats


def _doc(served):
    return run_document(served[1])


def _url(served) -> str:
    return _doc(served)["serving"]["grpc_url"]


def _ask(served, prompt=PROMPT, **inputs):
    values = {"text_input": prompt, **inputs}
    return stream_request(_url(served), "tensorrt_llm", values, raise_on_error=False)


def _texts(result) -> list[str]:
    return [r["text_output"].reshape(-1)[0].decode() for r in result.responses if "text_output" in r]


def test_run_passes_every_stage_exactly(served):
    assert_chain_passed(_doc(served), concurrencies=[1, 4], requests_per_point=4, reused=("import", "build"))
    workdir = served[0]
    version = workdir / "render" / "model_repository" / "tensorrt_llm" / "1"
    assert "NOT TensorRT-LLM" in (version / "tensorrt_llm" / "__init__.py").read_text()
    assert (workdir / "build" / "llmapi" / "model.yaml").is_file()


def test_text_output_like_nvidia_prompt_included_by_default(served):
    result = _ask(served, sampling_param_max_tokens=8)
    (response,) = result.responses
    assert response["text_output"].shape == (1,)
    assert _texts(result)[0].startswith(PROMPT + " Paris")  # exclude_input_from_output defaults to false
    excluded = _texts(_ask(served, sampling_param_max_tokens=8, sampling_param_exclude_input_from_output=True))[0]
    assert excluded.startswith(" Paris") and PROMPT not in excluded


def test_streaming_sends_the_growing_text(served):
    whole = _texts(_ask(served, sampling_param_max_tokens=16, sampling_param_exclude_input_from_output=True))[0]
    texts = _texts(_ask(served, sampling_param_max_tokens=16, sampling_param_exclude_input_from_output=True, streaming=True))
    assert len(texts) > 3
    assert all(b.startswith(a) for a, b in itertools.pairwise(texts))
    assert texts[-1] == whole


def test_stop_string_max_tokens_and_reasons(served):
    result = _ask(
        served,
        sampling_param_max_tokens=30,
        sampling_param_stop=["."],
        sampling_param_exclude_input_from_output=True,
        return_finish_reason=True,
        return_stop_reason=True,
    )
    (response,) = result.responses
    assert response["text_output"].reshape(-1)[0].decode() == " Paris"
    assert response["finish_reason"].reshape(-1)[0].decode() == "stop"
    assert response["stop_reason"].reshape(-1)[0].decode() == "."
    short = _ask(served, sampling_param_max_tokens=3, return_finish_reason=True, sampling_param_exclude_input_from_output=True)
    assert short.responses[0]["finish_reason"].reshape(-1)[0].decode() == "length"


def test_sampling_seed_top_k_top_p(served):
    def sample(seed):
        return _texts(
            _ask(
                served,
                "Tell me a story",
                sampling_param_max_tokens=12,
                sampling_param_temperature=1.0,
                sampling_param_top_p=0.95,
                sampling_param_top_k=50,
                sampling_param_seed=np.uint64(seed),
                sampling_param_exclude_input_from_output=True,
            )
        )[0]

    first, again = sample(7), sample(7)
    assert first == again
    assert len({sample(s) for s in (1, 2, 3, 4)}) > 1
    greedy = _texts(
        _ask(
            served,
            sampling_param_max_tokens=8,
            sampling_param_top_k=1,
            sampling_param_temperature=5.0,
            sampling_param_exclude_input_from_output=True,
        )
    )[0]
    assert greedy.startswith(" Paris")  # top_k 1 is greedy whatever the temperature (TensorRT-LLM's rule)


def test_an_error_leaves_the_other_requests_running(served):
    results = {}

    def good():
        results["good"] = _ask(served, sampling_param_max_tokens=24, sampling_param_exclude_input_from_output=True, streaming=True)

    thread = threading.Thread(target=good)
    thread.start()
    bad = _ask(served, "word " * 1500, sampling_param_max_tokens=4)  # longer than max_input_len 1024
    thread.join()
    assert bad.error and "max_input_len" in bad.error
    assert results["good"].error is None and _texts(results["good"])[-1].startswith(" Paris")


def test_client_that_disconnects_stops_the_generation(served):
    import tritonclient.grpc as grpcclient

    stats_file = served[2]
    before = json.loads(stats_file.read_text())
    client = grpcclient.InferenceServerClient(_url(served))
    arrived: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: arrived.put(error or result))
    text = grpcclient.InferInput("text_input", [1], "BYTES")
    text.set_data_from_numpy(np.array([b"Once upon a time"], dtype=object))
    flags = []
    for name, dtype, value in (
        ("sampling_param_max_tokens", "INT32", np.array([1000], np.int32)),
        ("streaming", "BOOL", np.array([True])),
        ("sampling_param_exclude_input_from_output", "BOOL", np.array([True])),
    ):
        tensor = grpcclient.InferInput(name, [1], dtype)
        tensor.set_data_from_numpy(value)
        flags.append(tensor)
    client.async_stream_infer("tensorrt_llm", [text, *flags], request_id="walks-away")
    for _ in range(3):
        arrived.get(timeout=60)
    client.stop_stream(cancel_requests=True)
    client.close()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        now = json.loads(stats_file.read_text())
        if now["aborted"] > before["aborted"]:
            break
        time.sleep(0.2)
    assert now["aborted"] == before["aborted"] + 1 and now["active"] == 0
    generated = now["generated_tokens"] - before["generated_tokens"]
    assert 3 <= generated < 1000  # the engine stopped long before max_tokens


def test_stop_request_ends_the_request_with_that_id(served):
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(_url(served))
    arrived: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: arrived.put((result, error)))

    def tensor(name, dtype, value):
        t = grpcclient.InferInput(name, [1], dtype)
        t.set_data_from_numpy(value)
        return t

    prompt = tensor("text_input", "BYTES", np.array([b"Once upon a time"], dtype=object))
    client.async_stream_infer(
        "tensorrt_llm",
        [
            prompt,
            tensor("sampling_param_max_tokens", "INT32", np.array([1000], np.int32)),
            tensor("streaming", "BOOL", np.array([True])),
            tensor("return_finish_reason", "BOOL", np.array([True])),
        ],
        request_id="story",
        enable_empty_final_response=True,
    )
    arrived.get(timeout=60)
    client.async_stream_infer(
        "tensorrt_llm", [prompt, tensor("stop", "BOOL", np.array([True]))], request_id="story", enable_empty_final_response=True
    )
    reasons, errors, deadline = [], [], time.monotonic() + 60
    while time.monotonic() < deadline and not (errors and "cancelled" in reasons):
        result, error = arrived.get(timeout=60)
        if error is not None:
            errors.append(str(error))
        elif result.as_numpy("finish_reason") is not None:
            reasons.append(result.as_numpy("finish_reason").reshape(-1)[0].decode())
    client.stop_stream()
    client.close()
    assert any("cancelled" in e.lower() for e in errors)  # the stop request's own answer, as NVIDIA's model sends it
    assert reasons[-1] == "cancelled"  # the stopped request ended with what it had generated


def test_perf_metrics_outputs_like_nvidia(served):
    result = _ask(
        served, sampling_param_max_tokens=6, sampling_param_return_perf_metrics=True, sampling_param_exclude_input_from_output=True
    )
    (response,) = result.responses
    stamps = [
        int(response[name].reshape(-1)[0])
        for name in ("arrival_time_ns", "first_scheduled_time_ns", "first_token_time_ns", "last_token_time_ns")
    ]
    assert stamps == sorted(stamps) and stamps[0] > 0
    assert response["kv_cache_alloc_total_blocks"].dtype == np.int32 and response["kv_cache_alloc_total_blocks"].reshape(-1)[0] >= 1
    assert response["kv_cache_hit_rate"].dtype == np.float32
    plain = _ask(served, sampling_param_max_tokens=6).responses[0]
    assert "arrival_time_ns" not in plain  # only when asked for
