"""Checks and facts about a Hugging Face checkpoint directory (config.json, safetensors, tokenizer files)."""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import asdict, dataclass
from pathlib import Path

from trtllm_forge.errors import ConfigError

# Files that define a tokenizer; one of these sets must be present.
TOKENIZER_FILE_SETS = (("tokenizer.json",), ("tokenizer.model",), ("vocab.json", "merges.txt"))
SMALL_FILE_SUFFIXES = (".json", ".model", ".txt", ".jinja", ".py", ".tiktoken")
SAFETENSORS_DTYPES = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "I8": "int8",
    "U8": "uint8",
    "I32": "int32",
    "I64": "int64",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
}


@dataclass(frozen=True)
class TokenizerFacts:
    bos_token_id: int | None
    eos_token_id: int | None
    pad_token_id: int | None
    add_bos_token: bool  # what encoding a prompt with the default add_special_tokens actually does
    tokenizer_class: str
    vocab_size: int
    has_chat_template: bool

    def to_json(self) -> dict:
        return asdict(self)


def weight_files(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.safetensors"))


def tokenizer_files(directory: Path) -> list[str]:
    for names in TOKENIZER_FILE_SETS:
        if all((directory / n).is_file() for n in names):
            return list(names)
    return []


def read_config_json(directory: Path, where: str = "model.source") -> dict:
    path = directory / "config.json"
    if not path.is_file():
        raise ConfigError(
            where,
            f"{str(directory)!r} has no config.json, so it is not a Hugging Face checkpoint directory",
            "give a directory with config.json, *.safetensors and tokenizer files, or a .gguf file",
        )
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ConfigError(where, f"{path} is not valid JSON ({exc.msg} at line {exc.lineno})", "fix or replace config.json") from None
    if not isinstance(data, dict):
        raise ConfigError(where, f"{path} is not a JSON object", "fix or replace config.json")
    return data


def check_hf_dir(directory: Path, tokenizer_dir: Path | None = None) -> dict:
    """Raise ConfigError unless `directory` holds config.json, safetensors weights and tokenizer files."""
    config = read_config_json(directory)
    if not weight_files(directory):
        bins = sorted(p.name for p in directory.glob("*.bin")) + sorted(p.name for p in directory.glob("*.pt"))
        if bins:
            raise ConfigError(
                "model.source",
                f"{str(directory)!r} has only PyTorch pickle weights ({bins[0]}…), which are not loaded (unsafe, slow)",
                "convert them to safetensors first, e.g. load with transformers and save_pretrained(..., safe_serialization=True)",
            )
        raise ConfigError("model.source", f"{str(directory)!r} has no *.safetensors weight files", "give a complete checkpoint directory")
    tok_dir = tokenizer_dir or directory
    where = "model.tokenizer" if tokenizer_dir else "model.source"
    if not tok_dir.is_dir():
        raise ConfigError(where, f"{str(tok_dir)!r} is not a directory", "give a directory with tokenizer files")
    if not tokenizer_files(tok_dir):
        raise ConfigError(
            where,
            f"{str(tok_dir)!r} has no tokenizer files",
            "it needs tokenizer.json, tokenizer.model, or vocab.json + merges.txt (or set model.tokenizer)",
        )
    return config


def safetensors_summary(files: list[Path]) -> tuple[int, dict[str, int]]:
    """(number of parameters, element count per dtype) read from the safetensors headers only."""
    total = 0
    by_dtype: dict[str, int] = {}
    for path in files:
        with path.open("rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            header = json.loads(handle.read(length))
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            count = 1
            for dim in entry["shape"]:
                count *= int(dim)
            total += count
            dtype = SAFETENSORS_DTYPES.get(entry["dtype"], entry["dtype"].lower())
            by_dtype[dtype] = by_dtype.get(dtype, 0) + count
    return total, by_dtype


def fingerprint(directory: Path) -> dict:
    """Cheap identity of a checkpoint directory for the stage's input hash.

    Small files (configs, tokenizer) are content-hashed; large weight files are identified by name, size
    and modification time, so a multi-GB checkpoint is not re-read on every run. Replacing weights in
    place with identical size and mtime would go unnoticed; `--force` covers that case.
    """
    small = hashlib.sha256()
    weights: dict[str, list] = {}
    for path in sorted(p for p in directory.iterdir() if p.is_file()):
        if path.suffix in SMALL_FILE_SUFFIXES:
            small.update(path.name.encode())
            small.update(path.read_bytes())
        else:
            stat = path.stat()
            weights[path.name] = [stat.st_size, stat.st_mtime_ns]
    return {
        "small_files_sha256": small.hexdigest(),
        "weight_files": weights,
        "policy": "content hash of small files; size+mtime of weight files",
    }


def tokenizer_facts(directory: Path, trust_remote_code: bool = False) -> TokenizerFacts:
    """Load the tokenizer the way serving does (AutoTokenizer, default add_special_tokens) and observe it."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(directory), trust_remote_code=trust_remote_code)
    ids = tokenizer("Hello world")["input_ids"]
    bos = tokenizer.bos_token_id
    return TokenizerFacts(
        bos_token_id=bos,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        add_bos_token=bool(ids) and bos is not None and ids[0] == bos,
        tokenizer_class=type(tokenizer).__name__,
        vocab_size=len(tokenizer),
        has_chat_template=bool(getattr(tokenizer, "chat_template", None)),
    )
