"""The transformers reference for `verify`: greedy token ids, perplexity, and the agreement measures."""

from __future__ import annotations

import math
import random

import pytest

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
    # Surplus tokens do not lower the prefix share of the reference, but do lower positionwise agreement.
    assert token_agreement([1, 2], [1, 2, 3, 4]) == 1.0
    assert positionwise_agreement([1, 2], [1, 2, 3, 4]) == 0.5
    assert not compare_tokens([1, 2], [1, 2, 3, 4]).identical


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
def test_ignore_eos_always_returns_the_requested_number_of_tokens(reference):
    eos = reference.tokenizer.eos_token_id
    # A chat turn that the instruct model answers and then closes with <|im_end|>.
    prompt = reference.tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True)
    ids = reference.encode(prompt)
    stopped = reference.generate_ids(ids, 40)
    assert stopped[-1] == eos and len(stopped) < 40
    assert len(reference.generate_ids(ids, 40, ignore_eos=True)) == 40


@pytest.mark.slow
def test_perplexity_on_the_shipped_text_is_plausible(reference):
    result = reference.perplexity()
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
