"""The second CPU engine for real: `trtllm-forge run configs/smollm2-cpu-onnxruntime.yaml` (import → build with
onnxruntime_genai's model builder → render → deploy → smoke → verify exact vs transformers in fp32 → bench) with
the CPU `tensorrt_llm` model driving ONNX Runtime GenAI inside a real Triton; then the TensorRT-LLM tensor
contract against the kept server (streaming, end_id, stop words, batches, refusals), and an int4 export that loads
and generates. One deployment for the whole module."""

from __future__ import annotations

import json
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from chain_helpers import assert_chain_passed, kept_run, run_document
from conftest import CONFIGS, REPO

from trtllm_forge.client import stream_request

pytestmark = pytest.mark.slow
CONFIG = CONFIGS / "smollm2-cpu-onnxruntime.yaml"
PROMPT = "The capital of France is"
ADAPTER_DIR = REPO / "model_repo_templates" / "cpu" / "tensorrt_llm"


@pytest.fixture(scope="module")
def served(tmp_path_factory, imported_smollm2, chain_host_profile):
    root = tmp_path_factory.mktemp("onnxruntime-e2e")
    with kept_run(root, CONFIG, [imported_smollm2.parent], chain_host_profile) as run:  # builds for real
        yield run


def _doc(served) -> dict:
    return run_document(served[1])


def _url(served) -> str:
    return _doc(served)["serving"]["grpc_url"]


def _prompt_ids(served) -> list[int]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(served[0] / "import" / "checkpoint"))
    return tokenizer(PROMPT)["input_ids"]


def _ask(served, ids: list[int], **inputs):
    values = {"input_ids": ids, "input_lengths": [len(ids)], **inputs}  # the client adds the batch dimension
    return stream_request(_url(served), "tensorrt_llm", values, raise_on_error=False)


def _tokens(result) -> list[int]:
    return [int(t) for r in result.responses if "output_ids" in r for t in r["output_ids"].reshape(-1)]


def test_run_passes_every_stage_and_verify_is_exact(served):
    assert_chain_passed(_doc(served), concurrencies=[1, 4], requests_per_point=4)

    workdir = served[0]
    engine = json.loads((workdir / "build" / "engine" / "config.json").read_text())
    assert engine["backend"] == "onnxruntime" and engine["build_config"]["max_batch_size"] == 8
    genai = json.loads((workdir / "build" / "engine" / "genai_config.json").read_text())
    assert genai["search"]["max_length"] == 2048 and genai["engine"]["static_batching"]["max_batch_size"] == 8
    (command,) = json.loads((workdir / "build" / "manifest.json").read_text())["commands"]
    assert command["argv"][1:3] == ["-m", "onnxruntime_genai.models.builder"] and command["argv"][command["argv"].index("-p") + 1] == "fp32"
    assert not any((workdir / "build").rglob("builder-cache"))
    version = workdir / "render" / "model_repository" / "tensorrt_llm" / "1"
    assert (version / "ort_engine.py").read_text() == (ADAPTER_DIR / "ort_engine.py").read_text()


def test_streamed_tokens_arrive_one_by_one_and_equal_the_whole(served):
    ids = _prompt_ids(served)
    whole = _ask(served, ids, request_output_len=[12])
    streamed = _ask(served, ids, request_output_len=[12], streaming=[True])
    assert whole.error is None and streamed.error is None
    sizes = [r["output_ids"].size for r in streamed.responses if "output_ids" in r]
    assert len(sizes) >= 6 and max(sizes) == 1
    assert _tokens(streamed) == _tokens(whole)


def test_end_id_minus_one_generates_the_full_length_and_stop_words_cut(served):
    ids = _prompt_ids(served)
    full = _tokens(_ask(served, ids, request_output_len=[24], end_id=[-1]))
    assert len(full) == 24
    stop_token = full[3]
    first = full.index(stop_token)
    words = np.asarray([[stop_token], [1]], dtype=np.int32)  # [2, words]: token ids, cumulative end offsets
    cut = _tokens(_ask(served, ids, request_output_len=[24], end_id=[-1], stop_words_list=words))
    assert cut == full[: first + 1]


def test_concurrent_requests_get_the_single_request_answer(served):
    ids = _prompt_ids(served)
    alone = _tokens(_ask(served, ids, request_output_len=[16]))
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda _: _ask(served, ids, request_output_len=[16], streaming=[True]), range(4)))
    assert all(r.error is None for r in results)
    assert [_tokens(r) for r in results] == [alone] * 4


@pytest.mark.parametrize(
    ("inputs", "named"),
    [
        ({"return_log_probs": [True]}, "return_log_probs"),
        ({"runtime_top_k": [20], "temperature": [0.8], "seed": [np.uint64(3)]}, "seed"),
        ({"presence_penalty": [0.5]}, "presence_penalty"),
    ],
)
def test_what_the_engine_cannot_honour_is_refused_not_ignored(served, inputs, named):
    result = _ask(served, _prompt_ids(served), request_output_len=[4], **inputs)
    assert result.error and named in result.error


def test_sampling_runs_and_stays_in_the_vocabulary(served):
    tokens = _tokens(_ask(served, _prompt_ids(served), request_output_len=[12], runtime_top_k=[40], runtime_top_p=[0.9], temperature=[1.0]))
    assert 1 <= len(tokens) <= 12 and all(0 <= t < 49152 for t in tokens)


def test_int4_export_loads_and_generates_sensible_tokens(served, ort_engine_int4):
    """builder output exists, is much smaller than fp32, loads in the adapter and continues the prompt sensibly."""
    from transformers import AutoTokenizer

    workdir = served[0]
    checkpoint = workdir / "import" / "checkpoint"
    engine_dir = ort_engine_int4[1].engine_dir  # the session's int4 build of this config
    assert engine_dir is not None
    fp32_size = (workdir / "build" / "engine" / "model.onnx.data").stat().st_size
    assert (engine_dir / "model.onnx.data").stat().st_size < fp32_size / 4
    engine = json.loads((engine_dir / "config.json").read_text())
    assert engine["pretrained_config"]["quantization"] == {"quant_algo": "W4A16", "kv_cache_quant_algo": None, "group_size": 32}

    sys.path.insert(0, str(ADAPTER_DIR))
    try:
        import ort_engine
    finally:
        sys.path.remove(str(ADAPTER_DIR))
    pipeline = ort_engine.ContinuousBatchingPipeline(str(engine_dir), ort_engine.SchedulerConfig(max_num_seqs=2))
    tokenizer = AutoTokenizer.from_pretrained(str(checkpoint))
    prompts = ["Monday, Tuesday, Wednesday,", PROMPT]
    config8 = ort_engine.GenerationConfig
    handles = [pipeline.add_request(i, tokenizer(p)["input_ids"], config8(max_new_tokens=8)) for i, p in enumerate(prompts)]
    outputs: list[list[int]] = [[], []]
    while pipeline.has_non_finished_requests():
        pipeline.step()
        for i, handle in enumerate(handles):
            if handle.can_read():
                outputs[i] += handle.read()[0].generated_ids
    texts = [tokenizer.decode(o) for o in outputs]
    # A 135M model at int4 loses facts ("Paris") but keeps the easiest continuations; exactness is for fp32 only.
    assert all(1 <= len(o) <= 8 for o in outputs) and "Thursday" in texts[0], texts
