"""The CPU `tensorrt_llm` model (OpenVINO GenAI in Triton's python backend) through a real tritonserver,
called with token ids exactly as the ensemble calls it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from conftest import TEST_KV_TOKENS, cpu_test_config, write_cpu_engine_repository

from trtllm_forge.client import stream_request
from trtllm_forge.sample_prompts import PROMPTS

pytestmark = pytest.mark.slow

MODEL = "tensorrt_llm"


@pytest.fixture(scope="module")
def prompt_ids(smollm2_checkpoint):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(smollm2_checkpoint))
    return [tokenizer(p)["input_ids"] for p in PROMPTS]


def request(server, ids, max_tokens, streaming=False, timeout_s=120.0, **extra):
    values = {"input_ids": ids, "input_lengths": [len(ids)], "request_output_len": [max_tokens], "streaming": [streaming]}
    values.update({k: v if isinstance(v, list) else [v] for k, v in extra.items()})
    return stream_request(server, MODEL, values, timeout_s=timeout_s, raise_on_error=False)


def tokens_of(result) -> list[int]:
    out: list[int] = []
    for response in result.responses:
        ids = response["output_ids"]
        assert ids.dtype == np.int32 and ids.ndim == 3, ids.shape  # [batch, beam, tokens]
        n = int(response["sequence_length"].reshape(-1)[0])
        assert n == ids.shape[-1]
        out.extend(int(t) for t in ids.reshape(-1)[:n])
    return out


@pytest.fixture(scope="module")
def alone(cpu_engine_server, prompt_ids):
    """Every prompt's 24 tokens, requested one at a time with nothing else in flight (not streamed): the engine's own
    reference that the concurrent tests compare with, requested once for the module. A shorter greedy output is
    a prefix of it."""
    return [request(cpu_engine_server, ids, 24) for ids in prompt_ids]


@pytest.fixture(scope="module")
def transformers_outputs(prompt_ids, transformers_greedy):
    """transformers' greedy 24 tokens for the first 4 prompts (the reference the engine must equal)."""
    return [transformers_greedy(ids, 24) for ids in prompt_ids[:4]]


def test_greedy_output_equals_transformers(alone, transformers_outputs):
    for result, want in zip(alone, transformers_outputs, strict=False):
        assert result.error is None, result.error
        assert len(result.responses) == 1
        assert tokens_of(result) == want


def test_exclude_input_in_output_false_prepends_the_prompt(cpu_engine_server, prompt_ids):
    ids = prompt_ids[0]
    plain = tokens_of(request(cpu_engine_server, ids, 8))
    with_prompt = request(cpu_engine_server, ids, 8, exclude_input_in_output=False)
    assert tokens_of(with_prompt) == ids + plain


def test_streaming_is_incremental_and_matches_the_non_streamed_output(cpu_engine_server, prompt_ids):
    ids = prompt_ids[1]
    whole = tokens_of(request(cpu_engine_server, ids, 32))
    streamed = request(cpu_engine_server, ids, 32, streaming=True, return_perf_metrics=True)
    assert streamed.error is None, streamed.error
    assert len(streamed.responses) == len(whole) > 1  # one response per token
    assert tokens_of(streamed) == whole
    assert streamed.arrival_s == sorted(streamed.arrival_s) and streamed.arrival_s[-1] > streamed.arrival_s[0]
    last = streamed.responses[-1]
    first_token = int(last["first_token_time_ns"].reshape(-1)[0])
    assert int(last["arrival_time_ns"].reshape(-1)[0]) <= first_token <= int(last["last_token_time_ns"].reshape(-1)[0])


def test_sixteen_concurrent_streams_all_complete_correctly(cpu_engine_server, prompt_ids, alone, transformers_outputs):
    assert all(result.error is None for result in alone), [result.error for result in alone]
    one_at_a_time = [tokens_of(result)[:16] for result in alone]
    with ThreadPoolExecutor(max_workers=16) as pool:
        results = list(pool.map(lambda ids: request(cpu_engine_server, ids, 16, streaming=True), prompt_ids))
    for prompt, result, want in zip(PROMPTS, results, one_at_a_time, strict=False):
        assert result.error is None, (prompt, result.error)
        assert tokens_of(result) == want, prompt
    for result, reference in zip(results, transformers_outputs, strict=False):
        assert tokens_of(result) == reference[:16]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"request_output_len": [0]},
            "request_output_len (max_tokens at the ensemble): 0 is outside the valid range; a whole number from 1 to 2047",
        ),
        ({"end_id": [49152]}, "end_id: 49152 is outside the valid range; a token id from 0 to 49151, or -1 for no end token"),
        ({"temperature": [-1.0]}, "temperature: -1.0 is outside the valid range; a finite number >= 0"),
        ({"input_ids": [], "input_lengths": [0]}, "prompt is empty"),
        ({"input_ids": [1] * 1025, "input_lengths": [1025]}, "more than the engine's max_input_len 1024"),
        ({"beam_width": [2]}, "beam width 1 only"),
        ({"input_ids": [49152, 5], "input_lengths": [2]}, "token ids must be in [0, 49152)"),
    ],
    ids=["max_tokens_0", "end_id_vocab", "temperature_negative", "empty_prompt", "too_long", "beam_width_2", "bad_token_id"],
)
def test_bad_request_gets_an_error_while_good_ones_succeed(cpu_engine_server, prompt_ids, alone, change, message):
    good_ids = prompt_ids[:3]
    with ThreadPoolExecutor(max_workers=4) as pool:
        good = [pool.submit(request, cpu_engine_server, ids, 24, True) for ids in good_ids]
        time.sleep(0.3)  # the bad request lands while the good ones generate
        values = {"input_ids": prompt_ids[0], "input_lengths": [len(prompt_ids[0])], "request_output_len": [8], **change}
        bad = stream_request(cpu_engine_server, MODEL, values, timeout_s=60, raise_on_error=False)
        good_results = [f.result() for f in good]
    assert bad.error is not None and message in bad.error
    for result, reference in zip(good_results, alone, strict=False):
        assert result.error is None, result.error
        assert reference.error is None, reference.error
        assert tokens_of(result) == tokens_of(reference)


_VANISHING_CLIENT = textwrap.dedent(
    """
    import sys, time, numpy as np, tritonclient.grpc as g
    url, n = sys.argv[1], int(sys.argv[2])
    client = g.InferenceServerClient(url)
    def tensor(name, array, dtype):
        t = g.InferInput(name, list(array.shape), dtype); t.set_data_from_numpy(array); return t
    seen = []
    client.start_stream(callback=lambda result=None, error=None: seen.append(1))
    ids = np.array([[1, 504, 3575, 282, 4649, 314]], dtype=np.int32)
    inputs = [tensor("input_ids", ids, "INT32"), tensor("input_lengths", np.array([[6]], np.int32), "INT32"),
              tensor("request_output_len", np.array([[n]], np.int32), "INT32"),
              tensor("streaming", np.array([[True]]), "BOOL")]
    client.async_stream_infer("tensorrt_llm", inputs, request_id="vanishing-client", enable_empty_final_response=True)
    while not seen:
        time.sleep(0.01)
    print("streaming", flush=True)
    time.sleep(600)
    """
)


def test_the_served_engine_compiles_with_the_runtime_properties(cpu_engine_server):
    """The engine model's load line names the properties its pipeline was compiled with: the runtime ones
    (genai_settings.RUNTIME_PROPERTIES: no thread pinning, TBB's static partitioner) under the engine's own."""
    import ast

    from trtllm_forge.model_repo_templates.cpu.tensorrt_llm.genai_settings import RUNTIME_PROPERTIES

    line = next(line for line in Path(cpu_engine_server.log).read_text(errors="replace").splitlines() if " loaded in " in line)
    properties = ast.literal_eval(line.split("properties=", 1)[1].split("}", 1)[0] + "}")
    assert RUNTIME_PROPERTIES.items() <= properties.items()
    assert properties["TBB_PARTITIONER"] == "STATIC" and properties["ENABLE_CPU_PINNING"] == "NO"
    assert properties["INFERENCE_PRECISION_HINT"] == "f32"  # the engine's own, from its config.json


def _stub_rss_bytes(deployment, model: str) -> int:
    """Resident memory of the python-backend stub serving `model` (deploy.health finds the server's stubs)."""
    from trtllm_forge.deploy.health import stub_pids

    (pid,) = stub_pids(deployment.pgid)[0][model]
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("VmRSS:")).split()[1]) * 1024


def test_the_served_engine_commits_its_kv_cache_pool_at_load(cpu_engine_server, cpu_engine_fp32):
    """The pool GenAI allocates (max_tokens_in_paged_kv_cache in 32-token blocks of f32 K and V for every layer) is
    resident when the model is ready, as TensorRT-LLM's is on a GPU: a decode step that opens blocks for all running
    sequences at once would otherwise pay their first-touch page faults (kv_pool.py)."""
    import re

    from trtllm_forge.model_repo_templates.cpu.tensorrt_llm.genai_settings import CPU_KV_BLOCK_SIZE, kv_blocks_for

    engine_dir = Path(cpu_engine_fp32[1].manifest["outputs"]["engine_dir"])
    hf = json.loads((engine_dir / "hf_config.json").read_text())
    head_dim = hf["hidden_size"] // hf["num_attention_heads"]
    token_bytes = hf["num_hidden_layers"] * 2 * hf["num_key_value_heads"] * head_dim * 4  # K and V, f32
    pool_bytes = kv_blocks_for(TEST_KV_TOKENS) * CPU_KV_BLOCK_SIZE * token_bytes

    line = next(line for line in Path(cpu_engine_server.log).read_text(errors="replace").splitlines() if " loaded in " in line)
    committed = re.search(r"warm-up of 16 requests \d+ ms; committed (\d+) MiB of new engine memory", line)
    assert committed, line
    assert int(committed.group(1)) >= pool_bytes // 2**20
    assert _stub_rss_bytes(cpu_engine_server, "tensorrt_llm") >= pool_bytes


def test_a_client_that_vanishes_mid_stream_does_not_stall_the_server(cpu_engine_server, prompt_ids):
    proc = subprocess.Popen(
        [sys.executable, "-c", _VANISHING_CLIENT, cpu_engine_server.grpc_url, "1500"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline().strip() == "streaming"
        proc.kill()
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    log = Path(cpu_engine_server.log)
    deadline = time.monotonic() + 20
    while "request vanishing-client cancelled by the client" not in log.read_text(errors="replace"):
        assert time.monotonic() < deadline, "the server kept generating for a client that is gone"
        time.sleep(0.2)
    started = time.monotonic()
    result = request(cpu_engine_server, prompt_ids[0], 8, streaming=True, timeout_s=30)
    assert result.error is None and len(tokens_of(result)) == 8
    assert time.monotonic() - started < 10


def test_log_probs_and_end_id(cpu_engine_server, prompt_ids):
    ids = prompt_ids[2]
    result = request(cpu_engine_server, ids, 12, return_log_probs=True)
    assert result.error is None, result.error
    tokens = tokens_of(result)
    per_token = result.responses[0]["output_log_probs"].reshape(-1)
    assert per_token.shape == (len(tokens),) and (per_token <= 0).all()
    assert result.responses[0]["cum_log_probs"].reshape(-1)[0] == pytest.approx(float(per_token.sum()), rel=1e-4)
    # end_id ends the sequence at its first occurrence, like an EOS token
    stop_at = next(i for i, t in enumerate(tokens) if i >= 2 and t not in tokens[:i])
    cut = tokens_of(request(cpu_engine_server, ids, 12, end_id=tokens[stop_at]))
    assert cut == tokens[: stop_at + 1]


@pytest.mark.parametrize("end_id", [-1], ids=["minus-one"])
def test_an_end_id_no_token_has_generates_the_full_length(cpu_engine_server, prompt_ids, end_id):
    """end_id -1 (TensorRT-LLM: no end token), with min_tokens, forces the output length: it must neither stop
    early nor crash the engine. An id outside the vocabulary is refused (request_checks.py; see the bad-request
    test), so OpenVINO GenAI never sees one."""
    result = request(cpu_engine_server, prompt_ids[1], 40, end_id=end_id, min_tokens=40)
    assert result.error is None, result.error
    assert len(tokens_of(result)) == 40
    after = request(cpu_engine_server, prompt_ids[0], 4)  # the server is still healthy
    assert after.error is None and len(tokens_of(after)) == 4


def _engine_with_draft(engine_dir: Path, root: Path, num_assistant_tokens: int) -> Path:
    """A copy (hard links) of `engine_dir` whose config.json names a draft model, laid out as the OpenVINO build
    writes it for engine.speculative.draft_target (here the fp32 IR itself drafts: every draft is accepted)."""
    from trtllm_forge.builders.openvino.plan import DRAFT_PROPERTIES, DRAFT_SUBDIR

    drafted = root / "engine"
    shutil.copytree(engine_dir, drafted, copy_function=os.link)
    shutil.copytree(engine_dir, drafted / DRAFT_SUBDIR, copy_function=os.link)
    config = json.loads((engine_dir / "config.json").read_text())
    config["openvino"]["draft"] = {
        "source": str(engine_dir),
        "subdir": DRAFT_SUBDIR,
        "weight_format": "as exported",
        "num_assistant_tokens": num_assistant_tokens,
        "properties": DRAFT_PROPERTIES,
        "argv": None,
    }
    (drafted / "config.json").unlink()
    (drafted / "config.json").write_text(json.dumps(config))
    return drafted


def test_a_draft_model_speculates_and_the_tokens_stay_the_targets(cpu_engine_fp32, prompt_ids, alone, triton_for_test, tmp_path):
    _workdir, result = cpu_engine_fp32
    drafted = _engine_with_draft(Path(result.manifest["outputs"]["engine_dir"]), tmp_path, num_assistant_tokens=3)
    server = triton_for_test(write_cpu_engine_repository(tmp_path / "repo", drafted), config=cpu_test_config())
    log = Path(server.log).read_text(errors="replace")
    assert "draft=draft x3" in log and "'INFERENCE_NUM_THREADS': '1'" in log  # the draft's own properties reached it
    for ids, reference in zip(prompt_ids[:3], alone, strict=False):
        assert reference.error is None, reference.error
        want = tokens_of(reference)  # the engine without a draft
        assert tokens_of(request(server, ids, 24)) == want
        streamed = request(server, ids, 24, streaming=True)
        assert streamed.error is None, streamed.error
        assert tokens_of(streamed) == want
        # accepted drafts arrive together: fewer responses than tokens shows the draft model was used
        assert len(streamed.responses) < len(want)


def test_the_build_plan_exports_a_draft_beside_the_engine(tmp_path):
    from trtllm_forge.builders.openvino.builder import plan_build

    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    config = cpu_test_config(engine={"speculative": {"mode": "draft_target", "max_draft_len": 4, "draft_model": str(checkpoint)}})
    plan = plan_build(config, tmp_path / "wd", checkpoint).to_json()
    draft_argv = plan["commands"][1]
    assert draft_argv[draft_argv.index("--model") + 1] == str(checkpoint)
    assert draft_argv[draft_argv.index("--weight-format") + 1] == "int8"
    assert draft_argv[-1] == str(tmp_path / "wd" / "build" / "engine" / "draft")
    (checkpoint / "openvino_model.xml").write_text("<net/>")  # an exported IR is copied, not exported again
    assert len(plan_build(config, tmp_path / "wd", checkpoint).to_json()["commands"]) == 1


def two_requests_stamped(server, prompt_ids, gap_s: float, lengths=(4, 4)) -> list[dict]:
    """Two requests (prompts 1 and 2), the second sent `gap_s` after the first; each one's arrival and first-token
    stamps (return_perf_metrics): one first-token stamp for both means one prefill step made both first tokens."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        first = pool.submit(request, server, prompt_ids[1], lengths[0], return_perf_metrics=True)
        time.sleep(gap_s)
        second = pool.submit(request, server, prompt_ids[2], lengths[1], return_perf_metrics=True)
        results = [first.result(), second.result()]
    stamps = []
    for result in results:
        assert result.error is None, result.error
        response = next(r for r in result.responses if "first_token_time_ns" in r)
        stamps.append({name: int(response[name].reshape(-1)[0]) for name in ("arrival_time_ns", "first_token_time_ns")})
    return stamps


def test_successors_of_requests_that_ended_together_share_one_prefill_step(cpu_engine_fp32, prompt_ids, triton_for_test, tmp_path):
    """The arrival window (arrival_window_ms): after a step that ended two requests, the engine waits for two new
    ones before its next step, so both are admitted together and one prefill step makes both first tokens (one
    stamp), although the second was sent half a second after the first. The window is 5 s here, so no machine is
    too slow for it; without it, the first successor would be admitted and prefilled alone."""
    import tritonclient.grpc as grpcclient

    _, build = cpu_engine_fp32
    engine_dir = Path(build.manifest["outputs"]["engine_dir"])
    server = triton_for_test(write_cpu_engine_repository(tmp_path / "repo", engine_dir, arrival_window_ms="5000"), config=cpu_test_config())
    assert "arrival_window_ms=5000" in Path(server.log).read_text(errors="replace")

    def tensor(name, array, dtype):
        t = grpcclient.InferInput(name, list(array.shape), dtype)
        t.set_data_from_numpy(array)
        return t

    ids = prompt_ids[0]
    pair = [  # one request of two sequences: admitted in one step, ended in one step
        tensor("input_ids", np.asarray([ids, ids], dtype=np.int32), "INT32"),
        tensor("input_lengths", np.asarray([[len(ids)]] * 2, dtype=np.int32), "INT32"),
        tensor("request_output_len", np.asarray([[4]] * 2, dtype=np.int32), "INT32"),
    ]
    ended = stream_request(server, MODEL, pair, timeout_s=120, raise_on_error=False)
    assert ended.error is None, ended.error
    stamps = two_requests_stamped(server, prompt_ids, 0.5)
    assert stamps[0]["arrival_time_ns"] < stamps[1]["arrival_time_ns"]
    assert stamps[0]["first_token_time_ns"] == stamps[1]["first_token_time_ns"]


def test_a_burst_after_an_idle_spell_shares_one_prefill_step_once_one_was_seen(cpu_engine_fp32, prompt_ids, triton_for_test, tmp_path):
    """The arrival window after an idle spell: a client that started two requests at once (a burst) will again; so
    at the next idle start the engine waits out the window (5 s here, so no machine is too slow for it), and two
    requests sent 0.5 s apart get their first tokens from one prefill step. One request at a time never waits."""
    _, build = cpu_engine_fp32
    engine_dir = Path(build.manifest["outputs"]["engine_dir"])
    server = triton_for_test(write_cpu_engine_repository(tmp_path / "repo", engine_dir, arrival_window_ms="5000"), config=cpu_test_config())

    alone = request(server, prompt_ids[0], 2)  # one request after the start: no burst seen, nothing waits
    assert alone.error is None, alone.error
    two_requests_stamped(server, prompt_ids, 0.0, lengths=(2, 8))  # a burst, learned; its two end in different steps
    learned = two_requests_stamped(server, prompt_ids, 0.5, lengths=(2, 2))
    assert learned[0]["arrival_time_ns"] < learned[1]["arrival_time_ns"]
    assert learned[0]["first_token_time_ns"] == learned[1]["first_token_time_ns"]
