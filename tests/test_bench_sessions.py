"""The shared-prefix, multi-turn workload (bench options prefix_len and turns, bench/workload.py sessions): every
prompt starts with the one system prompt, a session's turns grow by its earlier turns, and the options reach it from
the command line and the config."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import yaml
from conftest import CONFIGS

from trtllm_forge.bench.options import BenchOptions, from_command_line, from_workload
from trtllm_forge.bench.run import build_requests
from trtllm_forge.bench.specs import LengthSpec
from trtllm_forge.bench.workload import load_tokenizer, sessions
from trtllm_forge.config.load import parse_config
from trtllm_forge.errors import ConfigError


def test_sessions_share_the_system_prompt_and_grow_turn_by_turn(smollm2_checkpoint):
    tokenizer = load_tokenizer(smollm2_checkpoint)
    requests = sessions(9, 96, 3, LengthSpec(16), LengthSpec(8), np.random.default_rng(1), tokenizer)
    count = 3  # sessions: request i is turn i // 3 of session i % 3
    system = tokenizer.encode(requests[0].prompt, add_special_tokens=False)[:90]
    for request in requests:
        ids = tokenizer.encode(request.prompt, add_special_tokens=False)
        assert ids[:90] == system  # one system prompt for all
        assert request.input_tokens == len(ids) and request.input_tokens_source == "client_tokenizer"
        assert request.output_tokens == 8
    for session in range(count):
        turns = [requests[turn * count + session] for turn in range(3)]
        assert turns[1].prompt.startswith(turns[0].prompt) and turns[2].prompt.startswith(turns[1].prompt)
        # each turn adds an answer of the output length and a question of the prompt length (+- a token at the joins)
        assert [abs(b.input_tokens - a.input_tokens - 24) <= 3 for a, b in itertools.pairwise(turns)] == [True, True]
    assert len({requests[s].prompt for s in range(count)}) == count  # the sessions differ after the system prompt
    assert abs(requests[0].input_tokens - (96 + 16)) <= 2


def test_without_a_tokenizer_the_lengths_are_the_requested_ones():
    requests = sessions(4, 10, 2, LengthSpec(5), LengthSpec(3), np.random.default_rng(0))
    assert [r.input_tokens for r in requests] == [15, 15, 23, 23]
    assert all(r.input_tokens_source == "requested" for r in requests)
    assert requests[2].prompt.startswith(requests[0].prompt) and len(requests[2].prompt.split()) == 23


def test_the_options_come_from_the_command_line_and_the_config():
    given = from_command_line({"prefix_len": 700, "turns": 3})
    assert given == {"prefix_len": 700, "turns": 3}
    source = yaml.safe_load((CONFIGS / "smollm2-cpu-dynamo.yaml").read_text())
    source["bench"]["workloads"][0].update(prefix_len=640, turns=4)
    config = parse_config(source, CONFIGS)
    values = from_workload(config.bench.workloads[0], "bench.workloads[chat-short]")
    assert values["prefix_len"] == 640 and values["turns"] == 4
    source["bench"]["workloads"][0]["turns"] = 0
    with pytest.raises(Exception, match="turns"):
        parse_config(source, CONFIGS)


def test_a_dataset_with_a_shared_prefix_is_refused(tmp_path):
    dataset = tmp_path / "d.jsonl"
    dataset.write_text('{"prompt": "hi", "output_tokens": 2}\n')
    options = BenchOptions(url="-", model="m", dataset=dataset, prefix_len=32)
    with pytest.raises(ConfigError, match="prefix-len"):
        build_requests(options, None, 2, np.random.default_rng(0))
    plain = build_requests(
        BenchOptions(url="-", model="m", prefix_len=8, turns=2, input_len=LengthSpec(4)), None, 4, np.random.default_rng(0)
    )
    assert [r.input_tokens for r in plain] == [12, 12, 12 + 64 + 4, 12 + 64 + 4]  # the default output length: 64


def test_prefix_count_gives_the_sessions_distinct_system_prompts_in_turn(smollm2_checkpoint):
    tokenizer = load_tokenizer(smollm2_checkpoint)
    requests = sessions(6, 64, 1, LengthSpec(8), LengthSpec(4), np.random.default_rng(2), tokenizer, prefix_count=3)
    heads = [tuple(tokenizer.encode(r.prompt, add_special_tokens=False)[:56]) for r in requests]
    assert len(set(heads)) == 3  # three system prompts
    assert heads[:3] == heads[3:]  # session s takes prompt s mod 3
    assert from_command_line({"prefix_count": 5}) == {"prefix_count": 5}
