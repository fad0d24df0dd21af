"""The transformers reference for `verify`: greedy token ids, perplexity, and the agreement measures."""

from __future__ import annotations

import math
import random

import pytest
from conftest import cpu_test_config

from trtllm_forge.verify.check import PerplexityCheck, PerplexityStatus, PromptCheck, answer_ids, build_report
from trtllm_forge.verify.reference import (
    Agreement,
    compare_tokens,
    default_text,
    first_divergence,
    mean_agreement,
    positionwise_agreement,
    token_agreement,
)

# ---- agreement measures ----


def test_identical_sequences_agree_fully():
    result = compare_tokens([1, 2, 3, 4], [1, 2, 3, 4])
    assert result == Agreement(1.0, 1.0, None, 4, 4)
    assert result.identical


def test_prefix_agreement_stops_at_the_first_divergence():
    ref, got = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], [1, 2, 3, 9, 5, 6, 7, 8, 9, 10]
    assert token_agreement(ref, got) == 0.3
    assert positionwise_agreement(ref, got) == 0.9  # re-converged after one different token
    assert first_divergence(ref, got) == 3


def test_shorter_and_longer_outputs_count_as_mismatches():
    assert token_agreement([1, 2, 3, 4], [1, 2]) == 0.5
    assert positionwise_agreement([1, 2, 3, 4], [1, 2]) == 0.5
    assert first_divergence([1, 2, 3, 4], [1, 2]) == 2
    # An answer that runs on past the reference's end of sequence is as far from it as one that stops early.
    assert token_agreement([1, 2], [1, 2, 3, 4]) == 0.5
    assert positionwise_agreement([1, 2], [1, 2, 3, 4]) == 0.5
    assert compare_tokens([1, 2], [1, 2, 3, 4]) == Agreement(0.5, 0.5, 2, 2, 4)


def test_mean_agreement_counts_surplus_tokens():
    # One exact answer, one that runs 6 tokens past the reference's 2: 6 + 2 of 4 + 8 compared tokens agree.
    result = mean_agreement([([1, 2, 3, 4], [1, 2, 3, 4]), ([1, 2], [1, 2, 3, 4, 5, 6, 7, 8])])
    assert result.prefix == pytest.approx((4 + 2) / (4 + 8))
    assert result.first_divergence == 2 and result.reference_tokens == 6 and result.compared_tokens == 12


def test_empty_sequences():
    assert token_agreement([], []) == 1.0 and positionwise_agreement([], []) == 1.0
    assert token_agreement([], [5]) == 0.0
    assert token_agreement([5], []) == 0.0
    assert first_divergence([], []) is None


def test_completely_different_sequences():
    assert compare_tokens([1, 2, 3], [4, 5, 6]) == Agreement(0.0, 0.0, 0, 3, 3)


def test_mean_agreement_weights_by_reference_length():
    result = mean_agreement([([1, 2, 3, 4], [1, 2, 3, 4]), ([1, 2], [1, 9])])
    assert result.prefix == pytest.approx((4 * 1.0 + 2 * 0.5) / 6)
    assert result.first_divergence == 1
    assert result.reference_tokens == 6


# ---- the reference model (real SmolLM2 checkpoint from the import) ----


@pytest.fixture(scope="module")
def reference(reference_model):
    return reference_model  # the session's


@pytest.mark.slow
def test_reference_generation_is_greedy_token_ids(reference):
    prompts = ["The capital of France is", "def fibonacci(n):"]
    results = reference.generate(prompts, max_new_tokens=20)
    assert [r.prompt for r in results] == prompts
    france = results[0]
    assert france.prompt_ids == reference.tokenizer(prompts[0])["input_ids"]
    assert france.prompt_ids[0] != reference.tokenizer.bos_token_id
    assert len(france.output_ids) == 20
    assert "Paris" in france.text
    assert france.text == reference.decode(france.output_ids)
    # Token ids in, token ids out: the same prompt ids give the same continuation.
    assert reference.generate_ids(france.prompt_ids, 20) == france.output_ids
    assert reference.generate_ids(france.prompt_ids, 5) == france.output_ids[:5]


@pytest.mark.slow
def test_ignore_eos_runs_past_the_reference_end_and_fails_an_exact_verify(reference):
    eos = reference.tokenizer.eos_token_id
    # A chat turn that the instruct model answers and then closes with <|im_end|>.
    prompt = reference.tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True)
    ids = reference.encode(prompt)
    stopped = reference.generate_ids(ids, 40)
    assert stopped[-1] == eos and len(stopped) < 40
    went_on = reference.generate_ids(ids, 40, ignore_eos=True)
    assert len(went_on) == 40

    # Served by an engine that ignores EOS, the answer holds all of transformers' and goes on: a mismatch.
    ref, got = answer_ids(stopped, eos), answer_ids(went_on, eos)
    assert got[: len(ref)] == ref and len(got) > len(ref)
    check = PromptCheck(prompt, reference.decode(ref), reference.decode(got), reference.decode(got), ref, got, compare_tokens(ref, got))
    assert check.runs_past_end and check.agreement.prefix == len(ref) / len(got)
    unquantized = cpu_test_config()
    not_needed = PerplexityCheck(PerplexityStatus.NOT_NEEDED)
    report = build_report(unquantized, [check], not_needed)
    assert not report.passed and report.agreement.prefix < 1.0
    assert any(f"runs {len(got) - len(ref)} tokens past transformers' end" in p for p in report.problems), report.problems
    exact = PromptCheck(prompt, check.reference_text, check.reference_text, check.reference_text, ref, ref, compare_tokens(ref, ref))
    assert build_report(unquantized, [exact], not_needed).passed


@pytest.mark.slow
def test_perplexity_on_the_shipped_text_is_plausible(reference, reference_perplexity):
    result = reference_perplexity
    assert result.text_source.endswith("perplexity_en.txt")
    assert math.isfinite(result.perplexity)
    assert 5 < result.perplexity < 60  # 135M instruct model on plain English: about 22
    assert result.predicted_tokens > 400 and result.windows == math.ceil((result.predicted_tokens + result.windows) / 512)
    assert result.mean_nll == pytest.approx(math.log(result.perplexity))

    # The measure must separate text from word salad made of the same words.
    words = default_text()[0].split()
    random.Random(0).shuffle(words)
    shuffled = reference.perplexity(" ".join(words))
    assert shuffled.perplexity > 3 * result.perplexity
