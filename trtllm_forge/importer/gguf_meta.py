"""The GGUF metadata the import needs, read from the file's key-value header alone (no torch, no transformers).

`gguf.GGUFReader` parses every field and tensor description, the 49k-entry vocabulary arrays included (2.5 s of
CPU for SmolLM2); `plan`, `--dry-run` and the import's input hash only need a dozen scalars, so the header is read
here and arrays are skipped. The layout (little-endian: magic "GGUF", u32 version 2 or 3, u64 tensor count, u64
key-value count, then per pair a u64-length key, a u32 value type and the value) is ggml's GGUF spec
(ggml-org/ggml docs/gguf.md); `tests/test_import.py` compares the result with GGUFReader's on real files.
"""

from __future__ import annotations

import os
import struct
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from trtllm_forge.errors import ConfigError

if TYPE_CHECKING:
    from gguf import GGUFReader


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


# GGUF value type -> struct format of one scalar (8 = string, 9 = array are read separately).
SCALAR_FORMATS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9


class _Header:
    def __init__(self, stream: BinaryIO, size: int):
        self.stream, self.size = stream, size

    def count(self) -> int:
        """A u64 length or count; one larger than the file is a corrupt header (and would read forever)."""
        value = self.unpack("<Q")
        if value > self.size:
            raise ValueError(f"a length of {value} in a file of {self.size} bytes")
        return value

    def unpack(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        data = self.stream.read(size)
        if len(data) != size:
            raise ValueError("the file ends inside its header")
        return struct.unpack(fmt, data)[0]

    def string(self) -> str:
        return self.stream.read(self.count()).decode("utf-8", errors="replace")

    def value(self, kind: int) -> Any:
        if kind in SCALAR_FORMATS:
            return self.unpack(SCALAR_FORMATS[kind])
        if kind == STRING:
            return self.string()
        if kind == ARRAY:
            item_kind, count = self.unpack("<I"), self.count()
            if item_kind in SCALAR_FORMATS:
                self.stream.seek(count * struct.calcsize(SCALAR_FORMATS[item_kind]), 1)
            else:
                for _ in range(count):
                    self.value(item_kind)
            return None  # arrays (vocabularies, merges) are not needed here
        raise ValueError(f"unknown GGUF value type {kind}")


def read_metadata(path: Path) -> dict[str, Any]:
    """The scalar and string key-values of a GGUF file's header (arrays are skipped)."""
    try:
        with open(path, "rb") as stream:
            header = _Header(stream, os.fstat(stream.fileno()).st_size)
            if stream.read(4) != b"GGUF":
                raise ValueError("no GGUF magic")
            version = header.unpack("<I")
            if version not in (2, 3):
                raise ValueError(f"GGUF version {version}")
            header.unpack("<Q")  # tensor count
            pairs = header.count()
            metadata: dict[str, Any] = {}
            for _ in range(pairs):
                key = header.string()
                value = header.value(header.unpack("<I"))
                if value is not None:
                    metadata[key] = value
            return metadata
    except (OSError, ValueError, struct.error) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ConfigError("model.source", f"{str(path)!r} is not a readable GGUF file ({first})", "give a valid .gguf file") from None


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


def _bool(value: Any) -> bool | None:
    return None if value is None else bool(value)


def open_reader(path: Path) -> GGUFReader:
    from gguf import GGUFReader

    try:
        return GGUFReader(str(path))
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ConfigError("model.source", f"{str(path)!r} is not a readable GGUF file ({first})", "give a valid .gguf file") from None


def read_gguf_info(path: Path) -> GGUFInfo:
    metadata = read_metadata(path)
    arch = metadata.get("general.architecture")
    if not arch:
        raise ConfigError("model.source", f"{str(path)!r} has no general.architecture", "give a GGUF file of a language model")
    arch = str(arch)
    return GGUFInfo(
        path=str(path),
        architecture=arch,
        name=metadata.get("general.name"),
        context_length=_int(metadata.get(f"{arch}.context_length")),
        expert_count=_int(metadata.get(f"{arch}.expert_count")) or 0,
        tokenizer_model=metadata.get("tokenizer.ggml.model"),
        tokenizer_pre=metadata.get("tokenizer.ggml.pre"),
        add_bos_token=_bool(metadata.get("tokenizer.ggml.add_bos_token")),
        add_eos_token=_bool(metadata.get("tokenizer.ggml.add_eos_token")),
        bos_token_id=_int(metadata.get("tokenizer.ggml.bos_token_id")),
        eos_token_id=_int(metadata.get("tokenizer.ggml.eos_token_id")),
        pad_token_id=_int(metadata.get("tokenizer.ggml.padding_token_id")),
        unk_token_id=_int(metadata.get("tokenizer.ggml.unknown_token_id")),
        chat_template=metadata.get("tokenizer.chat_template"),
    )
