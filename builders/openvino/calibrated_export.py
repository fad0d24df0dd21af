"""INT4 export with data-aware AWQ and scale estimation on a local calibration file.

`optimum-cli export openvino --dataset` only takes named hub datasets (which it would download); the
Python API also accepts a list of strings, which is how a local file is used. Run as a child process by the
builder (heavy imports stay out of the CLI):

    python -m trtllm_forge.builders.openvino.calibrated_export --model HF_DIR --output OUT \
        --group-size 64 --dataset calib.jsonl --num-samples 128 --seq-len 512

The calibration file is JSONL with a "text" field per line, or plain text with one sample per paragraph
(blank-line separated) or per line.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from trtllm_forge.builders.cpu_export import HF_TOKENIZER_FILES


def read_samples(path: Path, limit: int) -> list[str]:
    text = path.read_text(encoding="utf-8")
    samples: list[str] = []
    if path.suffix in (".jsonl", ".json") or text.lstrip().startswith("{"):
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                raise SystemExit(f"error: {path}:{number}: not JSON; use one JSON object with a 'text' field per line") from None
            if isinstance(record, dict) and isinstance(record.get("text"), str) and record["text"].strip():
                samples.append(record["text"])
    else:
        blocks = [b.strip() for b in text.split("\n\n") if b.strip()]
        samples = blocks if len(blocks) > 1 else [line for line in text.splitlines() if line.strip()]
    if not samples:
        raise SystemExit(f"error: {path}: no calibration samples found; give non-empty text or JSONL with 'text'")
    return samples[:limit]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, type=Path)
    parser.add_argument("--output", required=True, type=Path)
    parser.add_argument("--group-size", type=int, default=128)
    parser.add_argument("--dataset", required=True, type=Path)
    parser.add_argument("--num-samples", type=int, default=128)
    parser.add_argument("--seq-len", type=int, default=512)
    args = parser.parse_args(argv)

    import openvino as ov
    from openvino_tokenizers import convert_tokenizer
    from optimum.intel import OVModelForCausalLM, OVWeightQuantizationConfig
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    samples = read_samples(args.dataset, args.num_samples)
    # Long samples are cut to seq_len tokens: calibration cost grows with length, not quality.
    samples = [tokenizer.decode(tokenizer(s)["input_ids"][: args.seq_len], skip_special_tokens=True) for s in samples]
    print(f"calibrating on {len(samples)} samples from {args.dataset}", flush=True)
    quantization = OVWeightQuantizationConfig(
        bits=4,
        group_size=args.group_size,
        ratio=1.0,
        awq=True,
        scale_estimation=True,
        dataset=samples,
        tokenizer=str(args.model),
        num_samples=len(samples),
    )
    model = OVModelForCausalLM.from_pretrained(args.model, export=True, quantization_config=quantization, compile=False)
    args.output.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(args.output)
    tokenizer.save_pretrained(args.output)
    ov_tokenizer, ov_detokenizer = convert_tokenizer(tokenizer, with_detokenizer=True)
    ov.save_model(ov_tokenizer, args.output / "openvino_tokenizer.xml")
    ov.save_model(ov_detokenizer, args.output / "openvino_detokenizer.xml")
    for name in HF_TOKENIZER_FILES:
        source = args.model / name
        if source.is_file() and not (args.output / name).exists():
            shutil.copy2(source, args.output / name)
    print(f"wrote {args.output}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
