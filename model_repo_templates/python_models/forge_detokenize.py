"""Incremental detokenization shared by the postprocessing and BLS models (copied next to their model.py).

Decoding each streamed token delta on its own drops word-leading spaces (SentencePiece) and splits
multi-byte characters into U+FFFD. Instead we keep, per request, the ids seen so far and decode a short
window ending at the newest id: text is released only once it is stable, i.e. once the window no longer
ends in an incomplete character. The concatenation of everything released plus `flush()` equals the
decode of all ids at once.

Self-contained on purpose: it runs inside the Triton python stub, which cannot import trtllm_forge.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Any, skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = []
        self.prefix_offset = 0  # start of the window that gives the next piece its context
        self.read_offset = 0  # ids before this have been released as text

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def push(self, new_ids: Iterable[int]) -> str:
        """Add ids; return the text that became final (possibly '')."""
        self.ids.extend(int(i) for i in new_ids)
        prefix_text = self._decode(self.ids[self.prefix_offset : self.read_offset])
        full_text = self._decode(self.ids[self.prefix_offset :])
        if len(full_text) > len(prefix_text) and not full_text.endswith(REPLACEMENT):
            piece = full_text[len(prefix_text) :]
            self.prefix_offset = self.read_offset
            self.read_offset = len(self.ids)
            return piece
        return ""

    def flush(self) -> str:
        """Text still held back at the end of the request (an incomplete character decodes as U+FFFD)."""
        prefix_text = self._decode(self.ids[self.prefix_offset : self.read_offset])
        full_text = self._decode(self.ids[self.prefix_offset :])
        self.prefix_offset = self.read_offset = len(self.ids)
        return full_text[len(prefix_text) :]


def anchored_decode(
    tokenizer: Any, ids: Sequence[int], anchor_ids: Sequence[int], skip_special_tokens: bool = True, anchor_text: str | None = None
) -> str:
    """Decode a delta of ids as it reads after earlier text, keeping its leading space.

    Used where no per-request state is available (the ensemble's stateless postprocessing): the
    anchor ids stand in for the preceding text so that SentencePiece does not strip the space.
    `anchor_text`: the anchor's own decode, when the caller keeps it (one decode per piece instead of two).
    """
    ids = [int(i) for i in ids]
    if not ids:
        return ""
    if not anchor_ids:
        return tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)
    base = tokenizer.decode(anchor_ids, skip_special_tokens=skip_special_tokens) if anchor_text is None else anchor_text
    text = tokenizer.decode(list(anchor_ids) + ids, skip_special_tokens=skip_special_tokens)
    return text[len(base) :] if text.startswith(base) else tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)
