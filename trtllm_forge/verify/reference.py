"""The transformers side of `verify`: greedy reference tokens and perplexity from a HF checkpoint.

Prompts are tokenized the way the served preprocessing does it (`AutoTokenizer`, default
`add_special_tokens`), generation is greedy, and everything crosses the API as token ids, so the
serving side can be compared token for token with `compare_tokens`.

Agreement between a reference sequence `ref` and a served sequence `got` is reported two ways:
- prefix agreement (`token_agreement`): the share matched before the first position where the two differ,
  over the longer of the two sequences: an answer that stops early and one that runs on past the reference's
  end of sequence both fall short of 1.0. Greedy decoding feeds each token back, so after one divergence the
  rest is a different continuation; this is the strict measure and the one thresholds apply to.
- positionwise agreement: the share of positions holding the same token, over the longer of the two
  sequences (a missing or surplus token counts as a mismatch). It shows how far apart two continuations
  are after they diverge, e.g. a quantized engine that differs by one token and then re-converges.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path

DEFAULT_TEXT = "data/perplexity_en.txt"
PERPLEXITY_WINDOW = 512  # tokens per window of the perplexity text


@dataclass(frozen=True)
class Agreement:
    prefix: float
    positionwise: float
    first_divergence: int | None  # index of the first differing position; None when identical
    reference_tokens: int
    compared_tokens: int

    @property
    def identical(self) -> bool:
        return self.first_divergence is None

    def to_json(self) -> dict:
        return asdict(self)


def first_divergence(ref: Sequence[int], got: Sequence[int]) -> int | None:
    for index, (a, b) in enumerate(zip(ref, got, strict=False)):
        if a != b:
            return index
    return None if len(ref) == len(got) else min(len(ref), len(got))


def longer_length(ref: Sequence[int], got: Sequence[int]) -> int:
    """What agreement is a share of: the longer sequence (a missing or surplus token is a mismatch)."""
    return max(len(ref), len(got))


def token_agreement(ref: Sequence[int], got: Sequence[int]) -> float:
    """Share of the longer sequence matched up to the first divergence: 1.0 only when `got` equals `ref`."""
    longest = longer_length(ref, got)
    if longest == 0:
        return 1.0
    diverged = first_divergence(ref, got)
    return (longest if diverged is None else diverged) / longest


def positionwise_agreement(ref: Sequence[int], got: Sequence[int]) -> float:
    """Share of positions with equal tokens, over the longer sequence."""
    longest = longer_length(ref, got)
    if longest == 0:
        return 1.0
    return sum(1 for a, b in zip(ref, got, strict=False) if a == b) / longest


def compare_tokens(ref: Sequence[int], got: Sequence[int]) -> Agreement:
    return Agreement(
        prefix=token_agreement(ref, got),
        positionwise=positionwise_agreement(ref, got),
        first_divergence=first_divergence(ref, got),
        reference_tokens=len(ref),
        compared_tokens=len(got),
    )


def mean_agreement(pairs: Sequence[tuple[Sequence[int], Sequence[int]]]) -> Agreement:
    """Agreement over many prompts: prefix and positionwise shares weighted by each pair's compared length
    (the longer of the two), so every token either side counts once."""
    results = [(compare_tokens(r, g), longer_length(r, g)) for r, g in pairs]
    total = sum(length for _, length in results) or 1
    divergences = [r.first_divergence for r, _ in results if r.first_divergence is not None]
    return Agreement(
        prefix=sum(r.prefix * length for r, length in results) / total,
        positionwise=sum(r.positionwise * length for r, length in results) / total,
        first_divergence=min(divergences) if divergences else None,
        reference_tokens=sum(r.reference_tokens for r, _ in results),
        compared_tokens=sum(r.compared_tokens for r, _ in results),
    )


@dataclass(frozen=True)
class Generation:
    prompt: str
    prompt_ids: list[int]
    output_ids: list[int]  # generated tokens only; ends with EOS when the model stopped early
    text: str  # output_ids decoded, special tokens skipped

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Perplexity:
    perplexity: float
    mean_nll: float
    predicted_tokens: int
    windows: int
    window_tokens: int
    text_source: str

    def to_json(self) -> dict:
        return asdict(self)


def text_perplexity(
    encode: Callable[[str], list[int]],
    window_nll: Callable[[Sequence[int]], float],
    text: str | None = None,
    window: int = PERPLEXITY_WINDOW,
) -> Perplexity:
    """Perplexity over consecutive non-overlapping windows of `window` tokens, for any model that gives the summed
    negative log-likelihood of a window (`window_nll`): the reference and every engine verify loads share this, so
    their figures differ only by the model. The first token of each window has no context and is not predicted."""
    source = "argument"
    if text is None:
        text, source = default_text()
    ids = encode(text)
    if len(ids) < 2:
        raise ValueError("perplexity needs a text of at least two tokens")
    total_nll = 0.0
    predicted = 0
    windows = 0
    for start in range(0, len(ids), window):
        chunk = ids[start : start + window]
        if len(chunk) < 2:
            break
        total_nll += window_nll(chunk)
        predicted += len(chunk) - 1
        windows += 1
    mean = total_nll / predicted
    return Perplexity(math.exp(mean), mean, predicted, windows, window, source)


def default_text() -> tuple[str, str]:
    """(text, where it came from): a few paragraphs of plain English shipped with trtllm-forge."""
    path = resources.files("trtllm_forge").joinpath(DEFAULT_TEXT)
    return path.read_text(encoding="utf-8"), f"trtllm_forge/{DEFAULT_TEXT}"


class ReferenceModel:
    """A HF checkpoint loaded with transformers on CPU, for reference outputs."""

    def __init__(
        self, checkpoint_dir: Path | str, tokenizer_dir: Path | str | None = None, dtype: str = "float32", trust_remote_code: bool = False
    ):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.checkpoint_dir = Path(checkpoint_dir)
        self.tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir or checkpoint_dir), trust_remote_code=trust_remote_code)
        torch_dtype = getattr(torch, dtype) if dtype != "auto" else "auto"
        self.model = AutoModelForCausalLM.from_pretrained(str(checkpoint_dir), dtype=torch_dtype, trust_remote_code=trust_remote_code)
        self.model.eval()

    def encode(self, prompt: str) -> list[int]:
        return list(self.tokenizer(prompt)["input_ids"])

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def generate_ids(self, prompt_ids: Sequence[int], max_new_tokens: int, ignore_eos: bool = False) -> list[int]:
        """Greedy continuation of one prompt (no padding, so no batch effects), new tokens only."""
        import torch

        ids = torch.tensor([list(prompt_ids)], dtype=torch.long)
        eos = self.model.generation_config.eos_token_id
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else eos
        with torch.no_grad():
            out = self.model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=max_new_tokens,
                min_new_tokens=max_new_tokens if ignore_eos else None,
                do_sample=False,
                num_beams=1,
                temperature=None,
                top_p=None,
                top_k=None,
                pad_token_id=pad,
            )
        return out[0, ids.shape[1] :].tolist()

    def generate(self, prompts: Sequence[str], max_new_tokens: int, ignore_eos: bool = False) -> list[Generation]:
        results = []
        for prompt in prompts:
            prompt_ids = self.encode(prompt)
            output_ids = self.generate_ids(prompt_ids, max_new_tokens, ignore_eos)
            results.append(Generation(prompt, prompt_ids, output_ids, self.decode(output_ids)))
        return results

    def perplexity(self, text: str | None = None, window: int = PERPLEXITY_WINDOW) -> Perplexity:
        """Perplexity on `text` (default: the shipped one), tokenized like prompts (`text_perplexity`)."""
        return text_perplexity(self.encode, self.window_nll, text, window)

    def window_nll(self, ids: Sequence[int]) -> float:
        """Summed negative log-likelihood of ids[1:], each predicted from the ids before it."""
        import torch

        tensor = torch.tensor([list(ids)], dtype=torch.long)
        with torch.no_grad():
            logits = self.model(tensor).logits.float()[0, :-1]
            return float(torch.nn.functional.cross_entropy(logits, tensor[0, 1:], reduction="sum"))
