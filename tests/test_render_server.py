"""The rendered cpu-kind repository on a real Triton server: ensemble and BLS over HTTP generate /
generate_stream and gRPC streaming, with an NVIDIA-style client.

The engine model here is a FAKE (named so): a python model with the TensorRT-LLM tensor contract that
"generates" a fixed reply, so these tests pin our pre/post-processing, BLS and ensemble wiring
independently of the CPU engine (tested with the real engine by the CPU engine model's own tests).
"""

from __future__ import annotations

import json
import queue
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import CONFIGS, REPO, forge_test_config

from trtllm_forge.config import load_config
from trtllm_forge.engine_config import read_engine_config
from trtllm_forge.render.repository import write_repository

pytestmark = pytest.mark.slow

ASCII_PROMPT, ASCII_REPLY = "The capital of France is", " Paris. The capital of Germany is Berlin, isn't it?"
MULTI_PROMPT, MULTI_REPLY = "Say hello in Japanese:", " こんにちは、世界！ Grüße 🎉 — ça va?"

FAKE_ENGINE = '''
"""FAKE engine model for tests: TensorRT-LLM tensor contract, replies with fixed token ids."""
import json
import threading
import numpy as np
import triton_python_backend_utils as pb_utils

REPLIES = json.loads(%r)


class TritonPythonModel:
    def initialize(self, args):
        pass

    def execute(self, requests):
        for request in requests:
            threading.Thread(target=self.serve, args=(request,)).start()
        return None

    def serve(self, request):
        sender = request.get_response_sender()
        ids = pb_utils.get_input_tensor_by_name(request, "input_ids").as_numpy().reshape(-1)
        length = int(pb_utils.get_input_tensor_by_name(request, "input_lengths").as_numpy().reshape(-1)[0])
        wanted = int(pb_utils.get_input_tensor_by_name(request, "request_output_len").as_numpy().reshape(-1)[0])
        streaming = pb_utils.get_input_tensor_by_name(request, "streaming")
        streaming = bool(streaming.as_numpy().reshape(-1)[0]) if streaming is not None else False
        reply = REPLIES.get(str(int(ids[length - 1])), [])[:wanted]
        chunks = [[t] for t in reply] if streaming else [reply]
        for chunk in chunks:
            out = np.array(chunk, dtype=np.int32).reshape(1, 1, -1)
            sender.send(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("output_ids", out),
                pb_utils.Tensor("sequence_length", np.array([[len(chunk)]], dtype=np.int32)),
                pb_utils.Tensor("batch_index", np.array([0], dtype=np.int32)),
            ]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
'''


@pytest.fixture(scope="module")
def tokenizer_dir(smollm2_gguf_tokenizer, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tokenizer")
    smollm2_gguf_tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def server(tokenizer_dir, triton_launcher, tmp_path_factory):
    import sys

    sys.path.insert(0, str(REPO / "model_repo_templates" / "python_models"))
    from tokenizer_loading import load_tokenizer

    tokenizer = load_tokenizer({"tokenizer_dir": str(tokenizer_dir)})
    engine_dir = tmp_path_factory.mktemp("fake-engine")
    shutil.copy(REPO / "tests" / "fixtures" / "engines" / "smollm2-cpu" / "config.json", engine_dir / "config.json")
    for item in tokenizer_dir.iterdir():
        shutil.copy(item, engine_dir / item.name)
    replies = {}
    for prompt, reply in ((ASCII_PROMPT, ASCII_REPLY), (MULTI_PROMPT, MULTI_REPLY)):
        replies[str(tokenizer.encode(prompt)[-1])] = tokenizer.encode(reply, add_special_tokens=False)
    workdir = tmp_path_factory.mktemp("render-wd")
    rendered = write_repository(
        load_config(CONFIGS / "smollm2-cpu.yaml"), workdir, read_engine_config(engine_dir), "cpu", workdir / "model_repository"
    )
    (rendered.repository / "tensorrt_llm" / "1" / "model.py").write_text(FAKE_ENGINE % json.dumps(replies))
    deployment = triton_launcher(rendered.repository, config=forge_test_config())
    return deployment, tokenizer


def http_generate(deployment, model: str, body: dict, stream: bool) -> list[dict]:
    import urllib.request

    path = "generate_stream" if stream else "generate"
    request = urllib.request.Request(
        f"{deployment.http_url}/v2/models/{model}/{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        text = response.read().decode("utf-8")
    if not stream:
        return [json.loads(text)]
    return [json.loads(line[len("data: ") :]) for line in text.splitlines() if line.startswith("data: ")]


def grpc_stream(deployment, model: str, inputs: dict) -> list[str]:
    """An NVIDIA-style tritonclient gRPC streaming client; returns the text_output of every response."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import np_to_triton_dtype

    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(deployment.grpc_url)
    tensors = []
    for name, value in inputs.items():
        array = np.array(value)
        array = np.array([[v.encode() for v in np.atleast_1d(value)]], dtype=object) if array.dtype.kind in "UO" else array.reshape(1, -1)
        tensor = grpcclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        tensor.set_data_from_numpy(array)
        tensors.append(tensor)
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    client.async_stream_infer(model, tensors, enable_empty_final_response=True)
    texts = []
    while True:
        result, error = results.get(timeout=60)
        assert error is None, error
        if result.as_numpy("text_output") is not None:
            texts.append(result.as_numpy("text_output").reshape(-1)[0].decode("utf-8"))
        if result.get_response().parameters["triton_final_response"].bool_param:
            break
    client.stop_stream()
    client.close()
    return texts


def test_all_models_ready(server):
    deployment, _ = server
    assert deployment.models and all(deployment.models.values())
    assert set(deployment.models) >= {"ensemble", "preprocessing", "tensorrt_llm", "postprocessing", "tensorrt_llm_bls"}


@pytest.mark.parametrize("model", ["ensemble", "tensorrt_llm_bls"])
def test_http_generate_non_streaming(server, model):
    deployment, _ = server
    [response] = http_generate(deployment, model, {"text_input": ASCII_PROMPT, "max_tokens": 64}, stream=False)
    assert response["text_output"] == ASCII_REPLY


@pytest.mark.parametrize("model", ["ensemble", "tensorrt_llm_bls"])
def test_http_generate_stream_keeps_spaces(server, model):
    deployment, _ = server
    responses = http_generate(deployment, model, {"text_input": ASCII_PROMPT, "max_tokens": 64, "stream": True}, stream=True)
    pieces = [r["text_output"] for r in responses if "text_output" in r]
    assert len(pieces) > 5 and "".join(pieces) == ASCII_REPLY


def test_bls_streams_multibyte_characters_exactly(server):
    deployment, _tokenizer = server
    responses = http_generate(deployment, "tensorrt_llm_bls", {"text_input": MULTI_PROMPT, "max_tokens": 64, "stream": True}, stream=True)
    pieces = [r["text_output"] for r in responses if "text_output" in r]
    assert "".join(pieces) == MULTI_REPLY
    assert not any("\ufffd" in p for p in pieces)


def test_grpc_streaming_with_an_nvidia_style_client(server):
    deployment, _ = server
    inputs = {
        "text_input": ASCII_PROMPT,
        "max_tokens": np.int32(64),
        "bad_words": "",
        "stop_words": "",
        "end_id": np.int32(2),
        "pad_id": np.int32(2),
        "top_k": np.int32(1),
        "top_p": np.float32(1.0),
        "temperature": np.float32(1.0),
        "stream": np.bool_(True),
    }
    for model in ("ensemble", "tensorrt_llm_bls"):
        texts = grpc_stream(deployment, model, inputs)
        assert "".join(texts) == ASCII_REPLY, model


def test_max_tokens_and_bls_stop_words(server):
    deployment, tokenizer = server
    [short] = http_generate(deployment, "ensemble", {"text_input": ASCII_PROMPT, "max_tokens": 2}, stream=False)
    reply_ids = tokenizer.encode(ASCII_REPLY, add_special_tokens=False)
    assert short["text_output"] == tokenizer.decode(reply_ids[:2])
    [stopped] = http_generate(
        deployment, "tensorrt_llm_bls", {"text_input": ASCII_PROMPT, "max_tokens": 64, "stop_words": ["Germany"]}, stream=False
    )
    assert stopped["text_output"] == " Paris. The capital of Germany"


def test_full_chain_on_the_real_cpu_engine(cpu_deployment):
    """render (cpu kind) on the real OpenVINO build: ensemble and BLS, streamed and not, give the same text.
    The session's rendered default on the fp32 build (conftest.cpu_deployment)."""
    deployment = cpu_deployment
    for prompt in ("The capital of France is", "Écris une phrase en français sur Paris:"):
        body = {"text_input": prompt, "max_tokens": 16, "temperature": 0.0, "top_k": 1}
        texts = {}
        for model in ("ensemble", "tensorrt_llm_bls"):
            texts[model] = http_generate(deployment, model, body, stream=False)[0]["text_output"]
            streamed = http_generate(deployment, model, {**body, "stream": True}, stream=True)
            texts[f"{model}-stream"] = "".join(r.get("text_output", "") for r in streamed)
        assert len(set(texts.values())) == 1, texts
        assert texts["ensemble"].strip()
