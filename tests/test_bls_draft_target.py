"""The BLS's draft-target loop on a real Triton server.

Both engine models here are FAKES (named so), python models with the TensorRT-LLM tensor contract, since the
real ones need a GPU: the FAKE target accepts draft tokens the way `draft_tokens_external` does when it accepts
by token (each draft token while it equals the target's own next token, then one token of its own) and reports
total_draft_tokens / total_accepted_draft_tokens; the FAKE draft (not decoupled, as render writes
tensorrt_llm_draft) proposes the target's continuation with every fourth token wrong. What is tested is ours:
the BLS loop (tensorrt_llm_bls/model.py `_draft_target_steps`), wired as render wires a draft-target repository
(tensorrt_llm_draft_model_name, default_num_draft_tokens).
"""

from __future__ import annotations

import json
import re
import shutil
import urllib.error
from pathlib import Path

import pytest
from conftest import CONFIGS, REPO, forge_test_config
from test_render_server import http_generate as _http_generate

from trtllm_forge.config import load_config
from trtllm_forge.engine_config import read_engine_config
from trtllm_forge.render.repository import write_repository

pytestmark = pytest.mark.slow

PROMPT = "The capital of France is"
REPLY = " Paris. The capital of Germany is Berlin, and the capital of Italy is Rome."
DRAFT_LEN = 4
WRONG_EVERY = 4  # the FAKE draft's token at generated position p is wrong when p % 4 == 3

_COMMON = '''
import json
import numpy as np
import triton_python_backend_utils as pb_utils

PROMPTS = json.loads(PROMPTS_JSON)  # [[prompt ids, reply ids], ...]


def value(request, name, default=None):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return default if tensor is None else tensor.as_numpy()


def truth_after(ids):
    """(the target's continuation, how much of it `ids` already holds) for a sequence starting with a prompt."""
    for prompt, reply in PROMPTS:
        if ids[: len(prompt)] == prompt:
            return reply, len(ids) - len(prompt)
    raise ValueError("unknown prompt")


def outputs(tokens, **extra):
    tensors = [
        pb_utils.Tensor("output_ids", np.array(tokens, dtype=np.int32).reshape(1, 1, -1)),
        pb_utils.Tensor("sequence_length", np.array([[len(tokens)]], dtype=np.int32)),
    ]
    tensors += [pb_utils.Tensor(name, np.array([[v]], dtype=np.int32)) for name, v in extra.items()]
    return pb_utils.InferenceResponse(output_tensors=tensors)


def sequence(request):
    ids = value(request, "input_ids").reshape(-1)
    assert bool(value(request, "exclude_input_in_output").reshape(-1)[0]), "the BLS must leave the input out"
    return ids[: int(value(request, "input_lengths").reshape(-1)[0])].tolist()
'''

FAKE_TARGET = (
    '"""FAKE target engine model for tests: accepts draft tokens by token, like draft_tokens_external."""\n'
    + _COMMON
    + """

class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            ids = sequence(request)
            truth, done = truth_after(ids)
            wanted = int(value(request, "request_output_len").reshape(-1)[0])
            drafts = value(request, "draft_input_ids")
            drafts = [] if drafts is None else drafts.reshape(-1).tolist()
            assert len(drafts) < wanted, "at most request_output_len - 1 draft tokens"
            accepted = 0
            while accepted < len(drafts) and done + accepted < len(truth) and drafts[accepted] == truth[done + accepted]:
                accepted += 1
            tokens = truth[done : done + (accepted + 1 if drafts else wanted)]
            streaming = bool(value(request, "streaming", np.array([False])).reshape(-1)[0])
            extra = {"total_draft_tokens": len(drafts), "total_accepted_draft_tokens": accepted}
            for chunk in ([[t] for t in tokens] if streaming and not drafts else [tokens]):
                sender.send(outputs(chunk, **extra))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""
)

FAKE_DRAFT = (
    '"""FAKE draft engine model for tests (not decoupled): the target\'s continuation with every fourth token wrong."""\n'
    + _COMMON
    + f"""

WRONG_EVERY = {WRONG_EVERY}


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            ids = sequence(request)
            truth, done = truth_after(ids)
            wanted = int(value(request, "request_output_len").reshape(-1)[0])
            assert int(value(request, "min_tokens").reshape(-1)[0]) == wanted, "the BLS asks for exactly num_draft_tokens"
            proposed = []
            for position in range(done, done + wanted):
                right = truth[position] if position < len(truth) else 0
                proposed.append(right + 1 if position % WRONG_EVERY == WRONG_EVERY - 1 else right)
            responses.append(outputs(proposed))
        return responses
"""
)


def _set_decoupled_false(config: Path, name: str) -> None:
    text = config.read_text().replace('name: "tensorrt_llm"', f'name: "{name}"', 1)
    config.write_text(re.sub(r"decoupled: true", "decoupled: false", text, count=1))


@pytest.fixture(scope="module")
def server(smollm2_gguf_tokenizer, triton_launcher, tmp_path_factory):
    tokenizer = smollm2_gguf_tokenizer
    engine_dir = tmp_path_factory.mktemp("fake-engine")
    shutil.copy(REPO / "tests" / "fixtures" / "engines" / "smollm2-cpu" / "config.json", engine_dir / "config.json")
    smollm2_gguf_tokenizer.save_pretrained(engine_dir)
    prompts = [[tokenizer.encode(PROMPT), tokenizer.encode(REPLY, add_special_tokens=False)]]
    workdir = tmp_path_factory.mktemp("render-wd")
    rendered = write_repository(
        load_config(CONFIGS / "smollm2-cpu.yaml"), workdir, read_engine_config(engine_dir), "cpu", workdir / "model_repository"
    )
    repo = rendered.repository
    (repo / "tensorrt_llm" / "1" / "model.py").write_text(FAKE_TARGET.replace("PROMPTS_JSON", repr(json.dumps(prompts))))
    shutil.copytree(repo / "tensorrt_llm", repo / "tensorrt_llm_draft")
    _set_decoupled_false(repo / "tensorrt_llm_draft" / "config.pbtxt", "tensorrt_llm_draft")
    (repo / "tensorrt_llm_draft" / "1" / "model.py").write_text(FAKE_DRAFT.replace("PROMPTS_JSON", repr(json.dumps(prompts))))
    # What render writes into the BLS of a draft-target repository (render/draft.py draft_bls_parameters).
    bls = repo / "tensorrt_llm_bls" / "config.pbtxt"
    text = bls.read_text()
    text = re.sub(r'(key: "tensorrt_llm_draft_model_name"\s*value: \{ string_value: )""', r'\1"tensorrt_llm_draft"', text, count=1)
    text += f'parameters {{\n  key: "default_num_draft_tokens"\n  value: {{ string_value: "{DRAFT_LEN}" }}\n}}\n'
    bls.write_text(text)
    return triton_launcher(repo, config=forge_test_config()), tokenizer


def http_generate(deployment, model: str, body: dict, stream: bool) -> list[dict]:
    """test_render_server's client; an HTTP error carries the server's message."""
    try:
        return _http_generate(deployment, model, body, stream)
    except urllib.error.HTTPError as exc:
        exc.msg = f"{exc.msg}: {exc.read().decode()}"
        raise


def scalar(value) -> int:
    return int(value[0] if isinstance(value, list) else value)


def reply_ids(tokenizer) -> list[int]:
    return tokenizer.encode(REPLY, add_special_tokens=False)


def test_drafted_text_is_the_targets_own(server):
    deployment, _ = server
    [response] = http_generate(deployment, "tensorrt_llm_bls", {"text_input": PROMPT, "max_tokens": 64}, stream=False)
    assert response["text_output"] == REPLY


def test_streamed_steps_carry_the_accepted_tokens(server):
    deployment, tokenizer = server
    responses = http_generate(deployment, "tensorrt_llm_bls", {"text_input": PROMPT, "max_tokens": 64, "stream": True}, stream=True)
    assert "".join(r.get("text_output", "") for r in responses) == REPLY
    steps = [r for r in responses if "total_draft_tokens" in r]
    n = len(reply_ids(tokenizer))
    # A wrong token every fourth position: steps of up to DRAFT_LEN + 1 tokens, far fewer steps than tokens.
    assert len(steps) < n / 2
    assert sum(scalar(r["total_accepted_draft_tokens"]) for r in steps) >= n // 2
    assert all(scalar(r["total_draft_tokens"]) <= DRAFT_LEN for r in steps)


def test_without_drafting_the_same_text_one_token_per_response(server):
    deployment, _tokenizer = server
    body = {"text_input": PROMPT, "max_tokens": 64, "stream": True, "num_draft_tokens": 0}
    responses = http_generate(deployment, "tensorrt_llm_bls", body, stream=True)
    assert "".join(r.get("text_output", "") for r in responses) == REPLY
    assert all(scalar(r.get("total_draft_tokens", 0)) == 0 for r in responses)


@pytest.mark.parametrize("max_tokens", [1, 5, 6, 11])
def test_max_tokens_is_kept_exactly(server, max_tokens):
    deployment, tokenizer = server
    [response] = http_generate(deployment, "tensorrt_llm_bls", {"text_input": PROMPT, "max_tokens": max_tokens}, stream=False)
    assert response["text_output"] == tokenizer.decode(reply_ids(tokenizer)[:max_tokens])


def test_stop_words_end_a_drafted_reply(server):
    deployment, _ = server
    body = {"text_input": PROMPT, "max_tokens": 64, "stop_words": ["Germany"], "num_draft_tokens": 2}
    [response] = http_generate(deployment, "tensorrt_llm_bls", body, stream=False)
    assert response["text_output"] == " Paris. The capital of Germany"


def test_more_draft_tokens_than_the_engine_takes_is_refused(server):
    deployment, _ = server
    with pytest.raises(urllib.error.HTTPError) as info:
        http_generate(deployment, "tensorrt_llm_bls", {"text_input": PROMPT, "max_tokens": 8, "num_draft_tokens": 9}, stream=False)
    assert info.value.code == 400 and "num_draft_tokens" in info.value.msg
