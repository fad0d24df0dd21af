"""Transformers' greedy answers kept per checkpoint, so `verify` loads the reference model only for what it has
not answered before.

Loading transformers and the checkpoint and generating greedily takes longer than the whole serving side of
`verify` (15 of 22 s for SmolLM2-135M here; minutes for a 7B model on CPU), and a user re-runs `run` or
`verify` on the same checkpoint after every engine or serving change. The answers are a pure function of the
checkpoint's files, the tokenizer's files, the prompt, the token budget, the dtype and the torch/transformers
versions, so those are the cache key: the files by content (sha256), never by path or time. One JSON file per
key under the user cache (`user_cache_dir()/reference`), written atomically; a file that cannot be read is
treated as absent and written anew.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtllm_forge.package_versions import installed_version
from trtllm_forge.stages import sha256_file, write_json_atomic
from trtllm_forge.user_cache import user_cache_dir
from trtllm_forge.verify.reference import Perplexity, ReferenceModel

SCHEMA = 1
REFERENCE_DTYPE = "float32"


def reference_key(checkpoint_dir: Path, tokenizer_dir: Path | None, trust_remote_code: bool) -> dict[str, Any]:
    """What transformers' greedy answers depend on, besides the prompt and the token budget."""
    return {
        "schema": SCHEMA,
        "checkpoint_sha256": sha256_file(checkpoint_dir),
        "tokenizer_sha256": sha256_file(tokenizer_dir) if tokenizer_dir else None,
        "dtype": REFERENCE_DTYPE,
        "trust_remote_code": trust_remote_code,
        "torch": installed_version("torch"),
        "transformers": installed_version("transformers"),
    }


@dataclass(frozen=True)
class Answer:
    prompt_ids: list[int]
    output_ids: list[int]  # new tokens only; ends with EOS when the model stopped early
    text: str


class CachedReference:
    """The reference side of `verify`: greedy answers, EOS/pad ids and perplexity, from the cache when this
    checkpoint answered them before, else from transformers (loaded on first need, then cached)."""

    def __init__(
        self,
        checkpoint_dir: Path,
        tokenizer_dir: Path | None = None,
        *,
        trust_remote_code: bool = False,
        enabled: bool = True,
        cache_root: Path | None = None,
    ):
        self.checkpoint_dir = Path(checkpoint_dir)
        self.tokenizer_dir = Path(tokenizer_dir) if tokenizer_dir else None
        self.trust_remote_code = trust_remote_code
        self._model: ReferenceModel | None = None
        self._tokenizer: Any = None
        self.computed = 0  # answers that needed transformers in this process
        self.path: Path | None = None
        self._entries: dict[str, Any] = {}
        if enabled:
            key = reference_key(self.checkpoint_dir, self.tokenizer_dir, trust_remote_code)
            name = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32]
            self.path = (cache_root or user_cache_dir() / "reference") / f"{name}.json"
            self._entries = self._read(key)
            self._entries["key"] = key

    def _read(self, key: dict[str, Any]) -> dict[str, Any]:
        try:
            assert self.path is not None
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) and data.get("key") == key else {}

    def _save(self) -> None:
        if self.path is not None:
            write_json_atomic(self.path, self._entries)

    @property
    def model(self) -> ReferenceModel:
        if self._model is None:
            self._model = ReferenceModel(
                self.checkpoint_dir, self.tokenizer_dir, dtype=REFERENCE_DTYPE, trust_remote_code=self.trust_remote_code
            )
        return self._model

    @property
    def tokenizer(self) -> Any:
        """The tokenizer alone, without loading the model: with a tokenizer.json the served preprocessing's loader
        (the `tokenizers` library; importing transformers takes ~7 s here), else transformers' AutoTokenizer."""
        if self._model is not None:
            return self._model.tokenizer
        if self._tokenizer is None:
            from trtllm_forge.model_repo_templates.python_models.tokenizer_loading import tokenizer_from_dir

            self._tokenizer = tokenizer_from_dir(self.tokenizer_dir or self.checkpoint_dir, self.trust_remote_code)
        return self._tokenizer

    @property
    def source(self) -> str:
        """'cache' when no answer needed transformers in this process, else 'transformers'."""
        return "cache" if self.computed == 0 and self.path is not None else "transformers"

    def special_ids(self) -> tuple[int, int]:
        """(end_id, pad_id): the model's EOS from its generation config; pad is the tokenizer's, else EOS."""
        cached = self._entries.get("special_ids")
        if cached is None:
            eos = self.model.model.generation_config.eos_token_id
            end_id = int(eos[0] if isinstance(eos, list) else eos)
            pad = self.model.tokenizer.pad_token_id
            cached = self._entries["special_ids"] = [end_id, end_id if pad is None else int(pad)]
            self._save()
        return int(cached[0]), int(cached[1])

    def greedy(self, prompt: str, max_tokens: int) -> Answer:
        answers = self._entries.setdefault("greedy", {})
        slot = json.dumps([prompt, max_tokens])
        if slot not in answers:
            self.computed += 1
            model = self.model
            prompt_ids = model.encode(prompt)
            output_ids = model.generate_ids(prompt_ids, max_tokens)
            answers[slot] = {"prompt_ids": prompt_ids, "output_ids": output_ids, "text": model.decode(output_ids)}
            self._save()
        found = answers[slot]
        return Answer([int(t) for t in found["prompt_ids"]], [int(t) for t in found["output_ids"]], str(found["text"]))

    def perplexity(self) -> Perplexity:
        """The reference model's perplexity on the shipped text (verify's quantized check)."""
        cached = self._entries.get("perplexity")
        if cached is None:
            self.computed += 1
            cached = self._entries["perplexity"] = self.model.perplexity().to_json()
            self._save()
        return Perplexity(**cached)
