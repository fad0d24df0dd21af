"""Tokenizer loading shared by the preprocessing, postprocessing and BLS models (copied next to their model.py).

Self-contained on purpose: it runs inside the Triton python stub, which cannot import trtllm_forge.

When the tokenizer directory has a tokenizer.json (every fast tokenizer) we load it with the `tokenizers`
library directly instead of transformers: importing transformers pulls huggingface_hub -> httpcore ->
ssl, and the ssl extension of a host Python can fail to load in the stub's embedded interpreter
("undefined symbol: _PyModule_Add" with the nvidia-pytriton 2.51 stub and Python 3.11.7). It also decodes
exactly what tokenizer.json says, whatever tokenizer_class the config names. transformers' AutoTokenizer
remains the fallback (slow tokenizers, trust_remote_code).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

TRUE_WORDS = {"1", "true", "t", "yes", "y", "on"}
FALSE_WORDS = {"0", "false", "f", "no", "n", "off"}


def model_parameters(model_config: dict) -> dict[str, str]:
    """The config.pbtxt parameters as plain strings; empty and unfilled values count as unset."""
    params = {}
    for key, value in (model_config.get("parameters") or {}).items():
        text = value.get("string_value", "") if isinstance(value, dict) else str(value)
        if text and not text.startswith("${"):
            params[key] = text
    return params


def as_bool(params: dict[str, str], key: str, default: bool) -> bool:
    value = params.get(key, "").strip().lower()
    if value in TRUE_WORDS:
        return True
    if value in FALSE_WORDS:
        return False
    return default


def clean_up_spaces(text: str) -> str:
    """The space clean-up transformers applies after decoding when clean_up_tokenization_spaces is set."""
    for before, after in (
        (" .", "."),
        (" ?", "?"),
        (" !", "!"),
        (" ,", ","),
        (" ' ", "'"),
        (" n't", "n't"),
        (" 'm", "'m"),
        (" 's", "'s"),
        (" 've", "'ve"),
        (" 're", "'re"),
    ):
        text = text.replace(before, after)
    return text


def _token_text(value: str | dict[str, str] | None) -> str | None:
    if isinstance(value, dict):
        return value.get("content")
    return value


class FastTokenizer:
    """The subset of a transformers tokenizer our models use, backed by tokenizer.json."""

    def __init__(self, directory: Path):
        from tokenizers import Tokenizer

        self.backend = Tokenizer.from_file(str(directory / "tokenizer.json"))
        config_path = directory / "tokenizer_config.json"
        config = json.loads(config_path.read_text(encoding="utf-8")) if config_path.is_file() else {}
        self.clean_up = bool(config.get("clean_up_tokenization_spaces", False))
        self.eos_token = _token_text(config.get("eos_token"))
        self.pad_token = _token_text(config.get("pad_token"))
        generation = directory / "generation_config.json"
        if self.eos_token is None and generation.is_file():
            eos = json.loads(generation.read_text(encoding="utf-8")).get("eos_token_id")
            eos = eos[0] if isinstance(eos, list) and eos else eos
            if isinstance(eos, int):
                self.eos_token = self.backend.id_to_token(eos)
        if self.pad_token is None:
            self.pad_token = self.eos_token
        named = [_token_text(config.get(key)) for key in ("bos_token", "unk_token")] + [self.eos_token, self.pad_token]
        extra = config.get("additional_special_tokens") or config.get("extra_special_tokens") or []
        named += [_token_text(t) for t in (extra.values() if isinstance(extra, dict) else extra)]
        self.special_tokens = [t for t in named if t]

    @property
    def all_special_ids(self) -> list[int]:
        """The ids of the named special tokens (bos, eos, unk, pad and the additional ones), as transformers'."""
        ids = {self.backend.token_to_id(token) for token in self.special_tokens}
        return sorted(i for i in ids if i is not None)

    @property
    def eos_token_id(self) -> int | None:
        return None if self.eos_token is None else self.backend.token_to_id(self.eos_token)

    def __len__(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        text = self.backend.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)
        return clean_up_spaces(text) if self.clean_up else text


def load_tokenizer(params: dict[str, str]) -> Any:  # a transformers tokenizer or a FastTokenizer
    tokenizer_dir = params.get("tokenizer_dir")
    if not tokenizer_dir:
        raise ValueError("parameter tokenizer_dir is not set; re-render the repository with trtllm-forge render")
    return tokenizer_from_dir(Path(tokenizer_dir), as_bool(params, "trust_remote_code", False))


def tokenizer_from_dir(directory: Path, trust_remote_code: bool = False) -> Any:
    """FastTokenizer when the directory has a tokenizer.json (and no remote code is trusted), else transformers'
    AutoTokenizer. Also what the bench and verify outside the server load (no transformers import: ~7 s)."""
    if (directory / "tokenizer.json").is_file() and not trust_remote_code:
        return FastTokenizer(directory)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(directory), trust_remote_code=trust_remote_code, padding_side="left")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def single_token_id(tokenizer: Any, token: str | None) -> int | None:
    """Id of a special token given as text (encoding it without special tokens)."""
    if token is None:
        return None
    backend = getattr(tokenizer, "backend", None)
    if backend is not None and backend.token_to_id(token) is not None:
        return int(backend.token_to_id(token))
    ids = tokenizer.encode(token, add_special_tokens=False)
    return int(ids[0]) if ids else None
