"""The GGUF metadata the import needs, read with the `gguf` package's reader (no torch, no transformers)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from trtllm_forge.errors import ConfigError


@dataclass(frozen=True)
class GGUFInfo:
    path: str
    architecture: str
    name: str | None
    context_length: int | None
    expert_count: int
    tokenizer_model: str | None  # "gpt2" (byte-level BPE) or "llama" (SentencePiece) ...
    tokenizer_pre: str | None  # llama.cpp pre-tokenizer name, e.g. "smollm"
    add_bos_token: bool | None
    add_eos_token: bool | None
    bos_token_id: int | None
    eos_token_id: int | None
    pad_token_id: int | None
    unk_token_id: int | None
    chat_template: str | None

    def to_json(self) -> dict:
        return asdict(self)


def _value(fields, key: str):
    field = fields.get(key)
    if field is None:
        return None
    try:
        return field.contents()
    except Exception:  # noqa: BLE001 - a malformed optional field counts as absent
        return None


def _int(value) -> int | None:
    return None if value is None else int(value)


def _bool(value) -> bool | None:
    return None if value is None else bool(value)


def open_reader(path: Path):
    from gguf import GGUFReader

    try:
        return GGUFReader(str(path))
    except Exception as exc:  # noqa: BLE001 - any parse failure means "not a usable GGUF"
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ConfigError("model.source", f"{str(path)!r} is not a readable GGUF file ({first})", "give a valid .gguf file") from None


def read_gguf_info(path: Path, reader=None) -> GGUFInfo:
    reader = reader or open_reader(path)
    fields = reader.fields
    arch = _value(fields, "general.architecture")
    if not arch:
        raise ConfigError("model.source", f"{str(path)!r} has no general.architecture", "give a GGUF file of a language model")
    arch = str(arch)
    return GGUFInfo(
        path=str(path),
        architecture=arch,
        name=_value(fields, "general.name"),
        context_length=_int(_value(fields, f"{arch}.context_length")),
        expert_count=_int(_value(fields, f"{arch}.expert_count")) or 0,
        tokenizer_model=_value(fields, "tokenizer.ggml.model"),
        tokenizer_pre=_value(fields, "tokenizer.ggml.pre"),
        add_bos_token=_bool(_value(fields, "tokenizer.ggml.add_bos_token")),
        add_eos_token=_bool(_value(fields, "tokenizer.ggml.add_eos_token")),
        bos_token_id=_int(_value(fields, "tokenizer.ggml.bos_token_id")),
        eos_token_id=_int(_value(fields, "tokenizer.ggml.eos_token_id")),
        pad_token_id=_int(_value(fields, "tokenizer.ggml.padding_token_id")),
        unk_token_id=_int(_value(fields, "tokenizer.ggml.unknown_token_id")),
        chat_template=_value(fields, "tokenizer.chat_template"),
    )
