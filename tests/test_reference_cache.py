"""verify's reference cache: transformers' greedy answers kept per checkpoint content, prompt and versions."""

from __future__ import annotations

import json
import shutil

import pytest
from tiny_checkpoint import write_tiny_model

from trtllm_forge.verify.reference import ReferenceModel
from trtllm_forge.verify.reference_cache import CachedReference

PROMPTS = ["The capital of France is", "def fibonacci(n):"]


@pytest.fixture(scope="module")
def tiny(smollm2_checkpoint, tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("tiny-reference"), like=smollm2_checkpoint)


def test_second_reference_answers_from_the_cache_without_loading_the_model(tiny, tmp_path):
    first = CachedReference(tiny, cache_root=tmp_path)
    answers = [first.greedy(p, 12) for p in PROMPTS]
    assert first.source == "transformers" and first.computed == 2

    fresh = ReferenceModel(tiny)
    for prompt, answer in zip(PROMPTS, answers, strict=False):
        assert answer.prompt_ids == fresh.encode(prompt)
        assert answer.output_ids == fresh.generate_ids(answer.prompt_ids, 12)
        assert answer.text == fresh.decode(answer.output_ids)
    eos = fresh.model.generation_config.eos_token_id
    assert first.special_ids()[0] == (eos[0] if isinstance(eos, list) else eos)

    second = CachedReference(tiny, cache_root=tmp_path)
    assert [second.greedy(p, 12) for p in PROMPTS] == answers
    assert second.special_ids() == first.special_ids()
    assert second.source == "cache" and second._model is None  # transformers' model never loaded

    # Another token budget is another answer: computed, then cached beside the others.
    assert second.greedy(PROMPTS[0], 5).output_ids == answers[0].output_ids[:5]
    assert second.source == "transformers"
    assert len(json.loads(second.path.read_text())["greedy"]) == 3


def test_changed_weights_or_versions_are_a_different_entry(tiny, tmp_path, monkeypatch):
    original = CachedReference(tiny, cache_root=tmp_path)
    original.greedy(PROMPTS[0], 4)

    edited = shutil.copytree(tiny, tmp_path / "edited")
    config = json.loads((edited / "generation_config.json").read_text())
    (edited / "generation_config.json").write_text(json.dumps({**config, "comment": "changed"}))
    assert CachedReference(edited, cache_root=tmp_path).path != original.path

    same_files = shutil.copytree(tiny, tmp_path / "copy")  # the content is the key, not the path
    assert CachedReference(same_files, cache_root=tmp_path).path == original.path

    import trtllm_forge.verify.reference_cache as module

    monkeypatch.setattr(module, "installed_version", lambda package: "0.0-other")
    assert CachedReference(tiny, cache_root=tmp_path).path != original.path


def test_an_unreadable_cache_file_is_recomputed_and_rewritten(tiny, tmp_path):
    first = CachedReference(tiny, cache_root=tmp_path)
    answer = first.greedy(PROMPTS[0], 4)
    first.path.write_text("{ truncated")
    again = CachedReference(tiny, cache_root=tmp_path)
    assert again.greedy(PROMPTS[0], 4) == answer and again.source == "transformers"
    assert json.loads(again.path.read_text())["greedy"]


def test_disabled_cache_always_computes_and_writes_nothing(tiny, tmp_path):
    reference = CachedReference(tiny, cache_root=tmp_path, enabled=False)
    reference.greedy(PROMPTS[0], 4)
    assert reference.path is None and reference.source == "transformers"
    assert not any(tmp_path.iterdir())
