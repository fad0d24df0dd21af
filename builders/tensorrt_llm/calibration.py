"""Local calibration data for ModelOpt quantization, so nothing is fetched from a hub.

quantize.py loads any local directory with `datasets.load_dataset(dir, split="train")` and reads its
`text` column; we write exactly that: `<dir>/train.jsonl` with one {"text": ...} per line.
"""

from __future__ import annotations

import json
from pathlib import Path

from trtllm_forge.errors import ConfigError

TEXT_KEYS = ("text", "article", "prompt", "content")
WHERE = "quantization.calibration.dataset"


def _jsonl_samples(path: Path) -> list[str]:
    samples = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            raise ConfigError(f"{path}:{number}", "not a JSON object", "one JSON object per line with a 'text' field") from None
        text = next((record[k] for k in TEXT_KEYS if isinstance(record, dict) and isinstance(record.get(k), str)), None)
        if text is None:
            raise ConfigError(f"{path}:{number}", "no text field", f"each line needs one of {', '.join(TEXT_KEYS)}")
        samples.append(text)
    return samples


def _text_samples(path: Path) -> list[str]:
    body = path.read_text(encoding="utf-8")
    paragraphs = [p.strip() for p in body.split("\n\n") if p.strip()]
    return paragraphs if len(paragraphs) > 1 else [line.strip() for line in body.splitlines() if line.strip()]


def read_samples(source: Path) -> list[str]:
    if not source.is_file():
        raise ConfigError(WHERE, f"{source} does not exist", 'a local JSONL ({"text": ...} per line) or text file')
    samples = _jsonl_samples(source) if source.suffix in (".jsonl", ".json") else _text_samples(source)
    if not samples:
        raise ConfigError(WHERE, f"{source} holds no samples", "add at least one non-empty text")
    return samples


def prepare_calibration(source: Path, destination: Path, size: int) -> int:
    """Write up to `size` samples to `destination` (a train.jsonl); return how many were written."""
    samples = read_samples(Path(source))[:size]
    destination.parent.mkdir(parents=True, exist_ok=True)
    with destination.open("w", encoding="utf-8") as handle:
        for text in samples:
            handle.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")
    return len(samples)
