"""NVIDIA's own Triton clients against our CPU deployment: the tensors, shapes and reads they use.

The client code below is ours, written from what NVIDIA's clients do (never copied). Checked against:

- NVIDIA/TensorRT-LLM @ 2a9abd9536aa62ad3e4b9314be9286b1b1be523b,
  triton_backend/inflight_batcher_llm/client/end_to_end_grpc_client.py (the 1.2-line copy; the same
  script sits under tools/ in some layouts). Every input is a [1, 1] array (`text_input` object,
  `max_tokens` int32, `stream`, `beam_width`, `temperature`, `exclude_input_in_output` always sent,
  False unless --exclude-input-in-output), `stop_words` / `bad_words` as a [1, n] object array; it
  always uses a gRPC stream (start_stream, async_stream_infer, stop_stream), streaming or not, drains
  the queue afterwards, reads `result.as_numpy("text_output")[0].decode("utf-8")` (so text_output must
  be 1-D: one string per request), and `batch_index` / `sequence_index` as `[0][0]` when present.
  Streamed pieces are appended; a non-streamed response holds the whole text (prompt + generated text
  when the input is not excluded).
- NVIDIA/TensorRT-LLM @ 000a01de66f0eab4ab05640711f0253f50f5209c,
  triton_backend/inflight_batcher_llm/client/inflight_batcher_llm_client.py: token ids straight to
  `tensorrt_llm`; input_ids [1, L] int32, input_lengths / request_output_len / beam_width / temperature /
  streaming / end_id / pad_id / runtime_top_k / runtime_top_p as [1, 1]; streaming or
  num_return_sequences → gRPC stream, else async_infer (needs a non-decoupled model); reads
  `output_ids[0][0]` (tokens of beam 0), `sequence_length[0][0]`, `cum_log_probs[0]`, `output_log_probs[0]`.
- NVIDIA/TensorRT-LLM @ 89fd9b74ab7ae753b4c6b3db25a400dca7ea54a0,
  triton_backend/tools/inflight_batcher_llm/end_to_end_test.py: non-decoupled `client.infer` on the
  ensemble and the BLS over HTTP or gRPC with the same [1, 1] inputs; it compares the ensemble's
  `text_output` with the postprocessing model's `OUTPUT` directly.
- What NVIDIA's models return (postprocessing/1/model.py @ 2e2327b93c0a9aa9abbf4c4672f734b03c1e441f:
  OUTPUT is np.array of one string per (batch item, beam), 1-D; tensorrt_llm_bls/1/lib/triton_decoder.py
  @ 07f3e442717f402fba3ef7b6471363747e31e3e1: text_output = postprocessing OUTPUT, the engine's other
  outputs passed through unchanged, i.e. 2-D with the batch dimension: batch_index [1, 1],
  cum_log_probs [1, beams], output_log_probs [1, beams, tokens]).

Two real servers on the real SmolLM2 OpenVINO engine: the repository rendered as configs/smollm2-cpu.yaml
has it (decoupled), and one rendered with triton.decoupled: false for the unary (infer) paths.
"""

from __future__ import annotations

import json
import queue
import urllib.request
from functools import partial
from pathlib import Path

import numpy as np
import pytest
from conftest import cpu_test_config

from trtllm_forge.engine_config import read_engine_config
from trtllm_forge.render.repository import write_repository

pytestmark = pytest.mark.slow

PROMPT = "The capital of France is"
MAX_TOKENS = 12


def _render_and_start(cpu_engine_fp32, start, tmp_path_factory, config, name: str):
    _, build = cpu_engine_fp32
    workdir = tmp_path_factory.mktemp(name)
    rendered = write_repository(
        config, workdir, read_engine_config(Path(build.manifest["outputs"]["engine_dir"])), "cpu", workdir / "model_repository"
    )
    return start(rendered.repository, config=config)


@pytest.fixture(scope="module")
def decoupled_server(cpu_deployment):
    """The session's shared deployment of configs/smollm2-cpu.yaml (decoupled)."""
    return cpu_deployment


@pytest.fixture(scope="module")
def unary_server(cpu_engine_fp32, triton_for_module, tmp_path_factory):
    config = cpu_test_config(triton={"decoupled": False}, runtime={"streaming": False})
    return _render_and_start(cpu_engine_fp32, triton_for_module, tmp_path_factory, config, "nv-unary")


@pytest.fixture(scope="module")
def reference(smollm2_checkpoint, transformers_greedy):
    """(tokenizer, prompt ids, greedy ids, greedy text) from transformers on the same checkpoint."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(smollm2_checkpoint))
    prompt_ids = tokenizer.encode(PROMPT)
    ids = transformers_greedy(prompt_ids, MAX_TOKENS)
    return tokenizer, prompt_ids, ids, tokenizer.decode(ids, skip_special_tokens=True)


# --- a client that uses the tensors the way NVIDIA's do ---------------------------------------------


def nv_tensor(module, name: str, array: np.ndarray):
    from tritonclient.utils import np_to_triton_dtype

    tensor = module.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
    tensor.set_data_from_numpy(array)
    return tensor


def e2e_inputs(prompt: str, streaming: bool, exclude_input: bool, stop_words=(), return_log_probs=False) -> dict:
    """end_to_end_grpc_client's request for one prompt: every value [1, 1], word lists [1, n]."""
    inputs = {
        "text_input": np.array([[prompt]]).astype(object),
        "max_tokens": np.ones((1, 1), dtype=np.int32) * MAX_TOKENS,
        "stream": np.array([[streaming]], dtype=bool),
        "beam_width": np.array([[1]], dtype=np.int32),
        "temperature": np.array([[1.0]], dtype=np.float32),
        "exclude_input_in_output": np.array([[exclude_input]], dtype=bool),
    }
    if stop_words:
        inputs["stop_words"] = np.array([list(stop_words)], dtype=object)
    if return_log_probs:
        inputs["return_log_probs"] = np.array([[True]], dtype=bool)
    return inputs


def stream_like_nvidia(url: str, model: str, inputs: dict, requested: list[str]) -> list:
    """start_stream / async_stream_infer / stop_stream, then drain the queue: NVIDIA's flow, streaming or not."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    completed: queue.Queue = queue.Queue()

    def on_result(sink, result, error):
        sink.put(error if error else result)

    client = grpcclient.InferenceServerClient(url=url)
    client.start_stream(callback=partial(on_result, completed))
    client.async_stream_infer(
        model,
        [nv_tensor(grpcclient, k, v) for k, v in inputs.items()],
        outputs=[grpcclient.InferRequestedOutput(n) for n in requested],
        request_id="",
    )
    client.stop_stream()  # returns once the server has closed the stream
    client.close()
    results = []
    while not completed.empty():
        item = completed.get()
        assert not isinstance(item, InferenceServerException), item
        results.append(item)
    return results


def texts_like_nvidia(results: list, streaming: bool) -> list[str]:
    """One text per batch item: streamed pieces appended, a non-streamed response replaces."""
    texts: dict[int, str] = {}
    for result in results:
        output = result.as_numpy("text_output")
        batch_index = result.as_numpy("batch_index")
        batch_index = 0 if batch_index is None else batch_index[0][0]
        piece = output[0].decode("utf-8")  # the read that fails on a [1, 1] text_output
        texts[batch_index] = texts.get(batch_index, "") + piece if streaming else piece
    return [texts[i] for i in sorted(texts)]


# --- ensemble and BLS, streamed and not (decoupled models, gRPC stream) ------------------------------


@pytest.mark.parametrize("streaming", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("model", ["ensemble", "tensorrt_llm_bls"])
def test_end_to_end_grpc_client_reads_text_output_0_decode(decoupled_server, reference, model, streaming):
    _, _, _, expected = reference
    results = stream_like_nvidia(decoupled_server.grpc_url, model, e2e_inputs(PROMPT, streaming, exclude_input=True), ["text_output"])
    assert results
    for result in results:
        text_output = result.as_numpy("text_output")
        assert text_output.shape == (1,) and text_output.dtype == object, text_output.shape
    if streaming:
        assert len(results) > 1  # one response per piece, not one at the end
    assert texts_like_nvidia(results, streaming) == [expected]


@pytest.mark.parametrize("model", ["ensemble", "tensorrt_llm_bls"])
def test_end_to_end_grpc_client_default_keeps_the_prompt_when_not_streaming(decoupled_server, reference, model):
    """NVIDIA's client sends exclude_input_in_output False by default and expects prompt + output then."""
    _, _, _, expected = reference
    results = stream_like_nvidia(decoupled_server.grpc_url, model, e2e_inputs(PROMPT, False, exclude_input=False), ["text_output"])
    assert texts_like_nvidia(results, streaming=False) == [PROMPT + expected]


@pytest.mark.parametrize("model", ["ensemble", "tensorrt_llm_bls"])
def test_end_to_end_grpc_client_stop_words(decoupled_server, reference, model):
    """--stop-words: a [1, n] object array; generation ends with the first stop word (engine: token match,
    BLS: text match; both keep the word, as TensorRT-LLM does)."""
    tokenizer, _, ids, expected = reference
    # A whole-word token from the middle of the greedy reply, spelled as the tokenizer spells it (leading space).
    word = next(tokenizer.decode(ids[k : k + 1]) for k in range(2, len(ids)) if tokenizer.decode(ids[k : k + 1]).strip().isalpha())
    results = stream_like_nvidia(
        decoupled_server.grpc_url, model, e2e_inputs(PROMPT, False, True, stop_words=[word, "zzzz"]), ["text_output"]
    )
    [text] = texts_like_nvidia(results, streaming=False)
    assert text == expected[: expected.index(word) + len(word)] and len(text) < len(expected)


def test_batch_inputs_come_back_per_item_with_batch_index(decoupled_server, reference):
    """--batch-inputs: two prompts stacked into one [2, 1] request; each response says its batch_index[0][0]."""
    _, _, _, expected = reference
    second = "Water boils at"
    rows = [e2e_inputs(p, False, True) for p in (PROMPT, second)]
    stacked = {k: np.concatenate([r[k] for r in rows], axis=0) for k in rows[0]}
    assert stacked["text_input"].shape == (2, 1)
    results = stream_like_nvidia(decoupled_server.grpc_url, "ensemble", stacked, ["text_output", "batch_index"])
    assert sorted(int(r.as_numpy("batch_index")[0][0]) for r in results) == [0, 1]
    texts = texts_like_nvidia(results, streaming=False)
    assert texts[0] == expected and texts[1] and texts[1] != expected


@pytest.mark.parametrize("model", ["ensemble", "tensorrt_llm_bls"])
def test_log_probs_have_nvidias_shapes(decoupled_server, reference, model):
    """--return-log-probs: cum_log_probs [1, beams], output_log_probs [1, beams, tokens] (read as [0])."""
    results = stream_like_nvidia(
        decoupled_server.grpc_url,
        model,
        e2e_inputs(PROMPT, False, True, return_log_probs=True),
        ["text_output", "cum_log_probs", "output_log_probs"],
    )
    [result] = results
    cum, per_token = result.as_numpy("cum_log_probs"), result.as_numpy("output_log_probs")
    assert cum.shape == (1, 1) and per_token.shape == (1, 1, MAX_TOKENS)
    assert np.all(per_token[0] <= 0) and np.isclose(cum[0][0], per_token[0].sum(), atol=1e-3)


# --- token ids straight to tensorrt_llm (inflight_batcher_llm_client.py) -----------------------------


def token_inputs(prompt_ids: list[int], streaming: bool, end_id: int, pad_id: int) -> dict:
    return {
        "input_ids": np.array([prompt_ids], dtype=np.int32),
        "input_lengths": np.array([[len(prompt_ids)]], dtype=np.int32),
        "request_output_len": np.array([[MAX_TOKENS]], dtype=np.int32),
        "beam_width": np.array([[1]], dtype=np.int32),
        "temperature": np.array([[1.0]], dtype=np.float32),
        "streaming": np.array([[streaming]], dtype=bool),
        "end_id": np.array([[end_id]], dtype=np.int32),
        "pad_id": np.array([[pad_id]], dtype=np.int32),
        "runtime_top_k": np.array([[1]], dtype=np.int32),
        "runtime_top_p": np.array([[0.0]], dtype=np.float32),
        "exclude_input_in_output": np.array([[True]], dtype=bool),
    }


def ids_like_nvidia(results: list, streaming: bool) -> list[int]:
    ids: list[int] = []
    for result in results:
        output_ids = result.as_numpy("output_ids")
        if output_ids is None:
            continue
        length = result.as_numpy("sequence_length")[0][0]
        tokens = list(output_ids[0][0])
        ids += tokens if streaming else tokens[:length]
    return ids


@pytest.mark.parametrize("streaming", [False, True], ids=["whole", "streamed"])
def test_inflight_batcher_llm_client_token_ids_over_a_stream(decoupled_server, reference, streaming):
    tokenizer, prompt_ids, expected_ids, _ = reference
    end_id = tokenizer.eos_token_id
    results = stream_like_nvidia(
        decoupled_server.grpc_url, "tensorrt_llm", token_inputs(prompt_ids, streaming, end_id, end_id), ["output_ids", "sequence_length"]
    )
    assert all(r.as_numpy("output_ids").shape[:2] == (1, 1) for r in results)
    assert ids_like_nvidia(results, streaming) == expected_ids


# --- non-decoupled models: client.infer (HTTP and gRPC) and async_infer -------------------------------


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("model", ["ensemble", "tensorrt_llm_bls"])
def test_end_to_end_test_infer_on_non_decoupled_models(unary_server, reference, model, protocol):
    """end_to_end_test.py's client.infer with [1, 1] inputs; text_output[0].decode() is the whole text."""
    _, _, _, expected = reference
    if protocol == "http":
        import tritonclient.http as module

        client = module.InferenceServerClient(url=unary_server.http_url.removeprefix("http://"))
    else:
        import tritonclient.grpc as module

        client = module.InferenceServerClient(url=unary_server.grpc_url)
    inputs = e2e_inputs(PROMPT, False, True)
    inputs.pop("stream")
    inputs["bad_words"] = np.array([[""]], dtype=object)
    inputs["stop_words"] = np.array([[""]], dtype=object)
    result = client.infer(model, [nv_tensor(module, k, v) for k, v in inputs.items()], outputs=[module.InferRequestedOutput("text_output")])
    client.close()
    assert result.as_numpy("text_output").shape == (1,)
    assert result.as_numpy("text_output")[0].decode("utf-8") == expected


def test_ensemble_text_output_equals_postprocessing_output(unary_server, reference):
    """end_to_end_test.py runs preprocessing → tensorrt_llm → postprocessing by hand and compares OUTPUT with
    the ensemble's text_output: both 1-D, equal."""
    import tritonclient.grpc as grpcclient

    _, _, _, expected = reference
    client = grpcclient.InferenceServerClient(url=unary_server.grpc_url)
    pre = client.infer(
        "preprocessing",
        [
            nv_tensor(grpcclient, "QUERY", np.array([[PROMPT]]).astype(object)),
            nv_tensor(grpcclient, "REQUEST_OUTPUT_LEN", np.array([[MAX_TOKENS]], dtype=np.int32)),
            nv_tensor(grpcclient, "BAD_WORDS_DICT", np.array([[""]], dtype=object)),
            nv_tensor(grpcclient, "STOP_WORDS_DICT", np.array([[""]], dtype=object)),
        ],
    )
    engine = client.infer(
        "tensorrt_llm",
        [
            nv_tensor(grpcclient, "input_ids", pre.as_numpy("INPUT_ID")),
            nv_tensor(grpcclient, "input_lengths", pre.as_numpy("REQUEST_INPUT_LEN")),
            nv_tensor(grpcclient, "request_output_len", pre.as_numpy("REQUEST_OUTPUT_LEN")),
            nv_tensor(grpcclient, "end_id", pre.as_numpy("OUT_END_ID")),
            nv_tensor(grpcclient, "pad_id", pre.as_numpy("OUT_PAD_ID")),
            nv_tensor(grpcclient, "exclude_input_in_output", np.array([[True]], dtype=bool)),
        ],
    )
    post = client.infer(
        "postprocessing",
        [
            nv_tensor(grpcclient, "TOKENS_BATCH", engine.as_numpy("output_ids").astype(np.int32)),
            nv_tensor(grpcclient, "SEQUENCE_LENGTH", engine.as_numpy("sequence_length")),
        ],
    )
    ensemble = client.infer("ensemble", [nv_tensor(grpcclient, k, v) for k, v in e2e_inputs(PROMPT, False, True).items() if k != "stream"])
    client.close()
    output, text_output = post.as_numpy("OUTPUT"), ensemble.as_numpy("text_output")
    assert output.shape == text_output.shape == (1,)
    assert output[0] == text_output[0] and text_output[0].decode("utf-8") == expected


def test_inflight_batcher_llm_client_async_infer_on_a_non_decoupled_engine(unary_server, reference):
    """The client's non-streaming branch: async_infer with parameters={'Streaming': False}, one response."""
    import tritonclient.grpc as grpcclient

    tokenizer, prompt_ids, expected_ids, _ = reference
    end_id = tokenizer.eos_token_id
    done: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url=unary_server.grpc_url)
    inputs = [nv_tensor(grpcclient, k, v) for k, v in token_inputs(prompt_ids, False, end_id, end_id).items()]
    client.async_infer(
        "tensorrt_llm", inputs, callback=lambda result, error: done.put((result, error)), request_id="", parameters={"Streaming": False}
    )
    result, error = done.get(timeout=120)
    client.close()
    assert error is None, error
    assert ids_like_nvidia([result], streaming=False) == expected_ids


def test_http_generate_returns_one_string(decoupled_server, reference):
    """The generate endpoint on a 1-D text_output: a plain JSON string (NVIDIA's shape), not a nested list."""
    _, _, _, expected = reference
    body = json.dumps({"text_input": PROMPT, "max_tokens": MAX_TOKENS}).encode()
    request = urllib.request.Request(
        f"{decoupled_server.http_url}/v2/models/ensemble/generate", data=body, headers={"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        reply = json.loads(response.read())
    assert reply["text_output"] == expected


# --- our own consumers read the same tensors -----------------------------------------------------------


@pytest.mark.parametrize("model", ["ensemble", "tensorrt_llm_bls"])
def test_our_client_reads_nvidias_shapes(decoupled_server, reference, model):
    """trtllm_forge.client (used by run's smoke test, verify and the docs) on the 1-D text_output."""
    from trtllm_forge.client import generate

    _, _, _, expected = reference
    whole = generate(decoupled_server, PROMPT, MAX_TOKENS, model=model, stream=False, exclude_input_in_output=True)
    streamed = generate(decoupled_server, PROMPT, MAX_TOKENS, model=model, stream=True, exclude_input_in_output=True)
    assert whole.text == streamed.text == expected
    assert len(streamed.chunks) > 1


@pytest.mark.parametrize("target", ["triton-grpc", "triton-http"])
def test_bench_targets_read_nvidias_shapes(decoupled_server, smollm2_checkpoint, tmp_path, target):
    """bench's gRPC and HTTP text targets on the 1-D text_output: every request completes with text."""
    from bench_helpers import bench_run, read_records

    url = decoupled_server.grpc_url if target == "triton-grpc" else decoupled_server.http_url
    proc, point = bench_run(
        url, target=target, concurrency=2, num_requests=4, input_len=8, output_len=6, tokenizer=smollm2_checkpoint, out=tmp_path
    )
    assert proc.returncode == 0, proc.stderr  # point: the summary of the one load point
    assert point["requests"]["completed"] == 4 and point["requests"]["failed"] == 0
    assert point["metrics"]["output_tokens"]["min"] > 0
    records = read_records(tmp_path)
    assert records and all(r["error"] is None and r["output_tokens"] > 0 for r in records), records[-1]


def test_our_text_read_takes_the_first_sequence_of_either_shape():
    from trtllm_forge.client import _text_of

    assert _text_of(np.array([b" Paris"], dtype=object)) == " Paris"  # NVIDIA's [1]
    assert _text_of(np.array([[b" Paris"]], dtype=object)) == " Paris"  # older [1, 1]
    assert _text_of(np.array([b"beam 0", b"beam 1"], dtype=object)) == "beam 0"  # [beams]: never glued together
    assert _text_of(None) == "" and _text_of(np.array([], dtype=object)) == ""
