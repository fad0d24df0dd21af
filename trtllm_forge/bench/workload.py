"""The requests a benchmark sends: synthetic prompts of exact token lengths (independent, or sessions sharing a
system prompt whose prompts grow turn by turn), a trtllm-bench-style JSONL dataset, or a ShareGPT file. Everything random comes from one seeded generator."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from trtllm_forge.bench.specs import LengthSpec
from trtllm_forge.errors import ConfigError


@dataclass(frozen=True, slots=True)
class BenchRequest:
    prompt: str
    input_ids: tuple[int, ...] | None
    input_tokens: int
    input_tokens_source: str  # client_tokenizer | dataset_ids | requested
    output_tokens: int


def load_tokenizer(path: Path | None) -> Any:
    if path is None:
        return None
    if not Path(path).is_dir():
        raise ConfigError("--tokenizer", f"{path} is not a directory", "give a Hugging Face tokenizer directory")
    # The served preprocessing's own loader: prompts are counted as the server will count them.
    from trtllm_forge.model_repo_templates.python_models.tokenizer_loading import tokenizer_from_dir

    return tokenizer_from_dir(Path(path))


def _exact_prompt(tokenizer: Any, length: int, rng: np.random.Generator, special: set[int]) -> tuple[str, tuple[int, ...]]:
    """Random token ids → text → ids again, trimmed or extended until the text encodes to `length` tokens."""
    vocab = len(tokenizer)
    ids = [int(i) for i in rng.integers(0, vocab, length + 8) if int(i) not in special][:length]
    while len(ids) < length:
        ids.append(int(rng.integers(0, vocab)))
    for _ in range(8):
        text = tokenizer.decode(ids, skip_special_tokens=True)
        encoded = tokenizer.encode(text, add_special_tokens=False)
        if len(encoded) == length:
            return text, tuple(encoded)
        ids = encoded[:length] + [int(rng.integers(0, vocab)) for _ in range(max(0, length - len(encoded)))]
    return text, tuple(encoded)  # closest found; the record carries the true count


def synthetic(n: int, input_len: LengthSpec, output_len: LengthSpec, rng: np.random.Generator, tokenizer: Any = None) -> list[BenchRequest]:
    isl = input_len.sample(n, rng)
    osl = output_len.sample(n, rng)
    requests = []
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    for i in range(n):
        if tokenizer is None:
            # No tokenizer: distinct numbered words; the length is what was asked, not a counted one.
            words = rng.integers(0, 10_000, isl[i])
            requests.append(BenchRequest(" ".join(f"w{w}" for w in words), None, isl[i], "requested", osl[i]))
        else:
            text, ids = _exact_prompt(tokenizer, isl[i], rng, special)
            requests.append(BenchRequest(text, ids, len(ids), "client_tokenizer", osl[i]))
    return requests


def _piece(tokenizer: Any, length: int, rng: np.random.Generator, special: set[int]) -> str:
    """Random text of `length` tokens (with a tokenizer; else distinct numbered words)."""
    if tokenizer is None:
        return " ".join(f"w{w}" for w in rng.integers(0, 10_000, length))
    return _exact_prompt(tokenizer, length, rng, special)[0]


def sessions(
    n: int,
    prefix_len: int,
    turns: int,
    input_len: LengthSpec,
    output_len: LengthSpec,
    rng: np.random.Generator,
    tokenizer: Any = None,
    prefix_count: int = 1,
) -> list[BenchRequest]:
    """`n` requests of ceil(n / turns) sessions; session s starts with system prompt s mod `prefix_count` (each of
    `prefix_len` tokens; one prompt shared by all when `prefix_count` is 1). Request i is turn
    i // S of session i % S (S sessions: a session's turns are S requests apart, so its earlier turn has usually
    ended when the next is sent); its prompt is the system prompt, the session's earlier questions each followed by
    an answer of output-length tokens (synthetic, not the model's), then its own question of input-length tokens."""
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    count = -(-n // turns)
    systems = [_piece(tokenizer, prefix_len, rng, special) for _ in range(prefix_count)] if prefix_len else []
    questions = input_len.sample(count * turns, rng)
    answers = output_len.sample(count * turns, rng)
    histories = [[systems[session % prefix_count]] if systems else [] for session in range(count)]
    requests = []
    for i in range(n):
        session, turn = i % count, i // count
        history = histories[session]
        history.append(_piece(tokenizer, questions[i], rng, special))
        prompt = "\n".join(history)
        tokens, source = _count(tokenizer, prompt)
        if tokenizer is None:
            tokens = prefix_len + sum(
                questions[j * count + session] + (answers[j * count + session] if j < turn else 0) for j in range(turn + 1)
            )
        requests.append(BenchRequest(prompt, None, tokens, source, answers[i]))
        history.append(_piece(tokenizer, answers[i], rng, special))
    return requests


def _count(tokenizer: Any, text: str) -> tuple[int, str]:
    if tokenizer is None:
        return len(re.findall(r"\S+", text)), "requested"
    return len(tokenizer.encode(text, add_special_tokens=False)), "client_tokenizer"


def from_dataset(
    path: Path, tokenizer: Any = None, output_len: LengthSpec | None = None, rng: np.random.Generator | None = None
) -> list[BenchRequest]:
    """A JSONL file of `{"prompt"|"input_ids", "output_tokens"}` lines, or a ShareGPT JSON file."""
    if not path.is_file():
        raise ConfigError("--dataset", f"{path} does not exist", "give a JSONL or ShareGPT file")
    text = path.read_text()
    try:
        if text.lstrip().startswith("["):
            return _sharegpt(json.loads(text), tokenizer, output_len, rng or np.random.default_rng(0))
        rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    except json.JSONDecodeError as exc:
        raise ConfigError(
            "--dataset", f"{path}: not JSON/JSONL ({exc.msg} at line {exc.lineno})", "one JSON object per line, or a ShareGPT list"
        ) from None
    requests = []
    for number, row in enumerate(rows, 1):
        osl = row.get("output_tokens")
        if output_len is not None:
            osl = output_len.sample(1, rng or np.random.default_rng(0))[0]
        if not isinstance(osl, int) or osl < 1:
            raise ConfigError(
                "--dataset", f"{path}:{number}: output_tokens missing or < 1", 'each line needs "output_tokens": N (or pass --output-len)'
            )
        if "input_ids" in row:
            ids = tuple(int(i) for i in row["input_ids"])
            prompt = tokenizer.decode(ids, skip_special_tokens=False) if tokenizer is not None else ""
            requests.append(BenchRequest(prompt, ids, len(ids), "dataset_ids", osl))
        elif "prompt" in row:
            count, source = _count(tokenizer, row["prompt"])
            requests.append(BenchRequest(row["prompt"], None, count, source, osl))
        else:
            raise ConfigError("--dataset", f"{path}:{number}: neither prompt nor input_ids", 'each line needs "prompt" or "input_ids"')
    return requests


def _sharegpt(data: list, tokenizer: Any, output_len: LengthSpec | None, rng: np.random.Generator) -> list[BenchRequest]:
    requests = []
    for item in data:
        turns = item.get("conversations") or item.get("conversation") or []
        if len(turns) < 2:
            continue
        prompt, reply = turns[0].get("value", ""), turns[1].get("value", "")
        if not prompt:
            continue
        count, source = _count(tokenizer, prompt)
        osl = output_len.sample(1, rng)[0] if output_len is not None else max(1, _count(tokenizer, reply)[0])
        requests.append(BenchRequest(prompt, None, count, source, osl))
    if not requests:
        raise ConfigError(
            "--dataset",
            "no usable ShareGPT conversations",
            'expects [{"conversations": [{"from": "human", "value": ...}, {"from": "gpt", ...}]}]',
        )
    return requests


def take(requests: list[BenchRequest], n: int, rng: np.random.Generator) -> list[BenchRequest]:
    """`n` requests: the dataset in a seeded shuffled order, cycled when it is shorter."""
    order = rng.permutation(len(requests))
    return [requests[order[i % len(order)]] for i in range(n)]
