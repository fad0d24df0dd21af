"""Convert a GGUF file into a Hugging Face checkpoint directory (child process of the import stage).

    python -m trtllm_forge.importer.gguf_to_hf --gguf FILE --out DIR --dtype float32 --report REPORT.json

transformers dequantizes the GGUF weights on load but refuses `save_pretrained` on a GGUF-loaded model,
so a fresh model is built from the same config, given the loaded state dict, and saved as safetensors.
The result is re-loaded from disk and compared with the GGUF-loaded model before the report is written.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from gguf import GGUFReader
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

from trtllm_forge.importer.gguf_meta import GGUFInfo, open_reader, read_gguf_info
from trtllm_forge.importer.gguf_tokenizer import (
    PROBE_TEXT,
    build_bpe_tokenizer,
    builds_natively,
    fallback_tokenizer,
    strip_bos_from_saved,
)

# Bump when the conversion's output changes, so earlier imports are redone.
CONVERTER_VERSION = 1
# Largest logit difference accepted between the saved float32 checkpoint and the GGUF-loaded model.
FLOAT32_LOGIT_TOLERANCE = 1e-4


class ConversionError(Exception):
    pass


def _torch_dtype(name: str) -> torch.dtype:
    import torch

    return {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[name]


def convert_model(gguf_path: Path, out: Path, dtype: str, info: GGUFInfo) -> PreTrainedModel:
    """Save the GGUF's weights as a safetensors checkpoint; return the GGUF-loaded model (for checking)."""
    import torch
    from transformers import AutoModelForCausalLM

    started = time.monotonic()
    loaded = AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32)
    loaded.eval()
    load_s = time.monotonic() - started

    config = loaded.config
    for attr, value in (("bos_token_id", info.bos_token_id), ("eos_token_id", info.eos_token_id), ("pad_token_id", info.pad_token_id)):
        if value is not None:
            setattr(config, attr, value)
    config._name_or_path = info.name or gguf_path.stem
    with torch.device("meta"):
        fresh = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    fresh.load_state_dict(loaded.state_dict(), strict=True, assign=True)
    if fresh.config.tie_word_embeddings:
        fresh.tie_weights()
    fresh = fresh.to(_torch_dtype(dtype))
    fresh.config.dtype = dtype
    generation = fresh.generation_config
    for attr, value in (("bos_token_id", info.bos_token_id), ("eos_token_id", info.eos_token_id), ("pad_token_id", info.pad_token_id)):
        if value is not None:
            setattr(generation, attr, value)
    fresh.save_pretrained(str(out), safe_serialization=True)
    del fresh
    return loaded, load_s


def convert_tokenizer(reader: GGUFReader, gguf_path: Path, out: Path, info: GGUFInfo) -> tuple[str, Any]:
    if builds_natively(info):
        tokenizer = build_bpe_tokenizer(reader, info)
        mode = "built from GGUF vocabulary"
    else:
        tokenizer = fallback_tokenizer(gguf_path, info)
        mode = "transformers GGUF tokenizer, special tokens corrected"
    if info.chat_template:
        tokenizer.chat_template = info.chat_template
    tokenizer.save_pretrained(str(out))
    if builds_natively(info):
        # transformers 5 saves `TokenizersBackend`, which 4.x (TensorRT-LLM containers) cannot resolve;
        # GPT2Tokenizer loads the same tokenizer.json in both.
        _update_tokenizer_config(out, tokenizer_class="GPT2Tokenizer", add_bos_token=False, add_prefix_space=False)
    else:
        # transformers' GGUF tokenizer classes (e.g. CodeLlamaTokenizer) rebuild their pipeline on load
        # instead of reading tokenizer.json; the generic fast class uses the saved file as it is.
        _update_tokenizer_config(out, tokenizer_class="PreTrainedTokenizerFast")
        if info.add_bos_token is False:
            strip_bos_from_saved(out, tokenizer.bos_token)
    return mode, tokenizer


def _update_tokenizer_config(out: Path, **values: object) -> None:
    path = out / "tokenizer_config.json"
    config = json.loads(path.read_text())
    config.update(values)
    path.write_text(json.dumps(config, ensure_ascii=False, indent=2) + "\n")


def check_tokenizer(out: Path, info: GGUFInfo, in_memory: PreTrainedTokenizerBase, native: bool) -> dict:
    """Re-load the saved tokenizer as serving will, and hold it to the GGUF's rules."""
    from transformers import AutoTokenizer

    from trtllm_forge.importer.hf_checkpoint import tokenizer_facts

    facts = tokenizer_facts(out)
    problems = []
    if info.add_bos_token is not None and facts.add_bos_token != info.add_bos_token:
        problems.append(f"re-loaded tokenizer add_bos={facts.add_bos_token}, GGUF says {info.add_bos_token}")
    for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
        want = getattr(info, name)
        if want is not None and getattr(facts, name) != want:
            problems.append(f"{name} is {getattr(facts, name)}, GGUF says {want}")
    reloaded = AutoTokenizer.from_pretrained(str(out))
    got = reloaded(PROBE_TEXT)["input_ids"]
    want_ids = in_memory(PROBE_TEXT)["input_ids"]
    if not native and want_ids and info.add_bos_token is False and want_ids[0] == in_memory.bos_token_id:
        want_ids = want_ids[1:]
    if got != want_ids:
        problems.append(f"re-loaded tokenizer encodes the probe text differently ({got[:8]}… vs {want_ids[:8]}…)")
    if reloaded.decode(got) != PROBE_TEXT:
        problems.append("re-loaded tokenizer does not decode the probe text back to itself")
    if problems:
        raise ConversionError("tokenizer check failed: " + "; ".join(problems))
    return facts.to_json()


def check_model(out: Path, loaded: PreTrainedModel, probe_ids: list[int], dtype: str) -> dict:
    """Compare the saved checkpoint's logits with the GGUF-loaded model's on the probe tokens."""
    import torch
    from transformers import AutoModelForCausalLM

    saved = AutoModelForCausalLM.from_pretrained(str(out))
    saved.eval()
    ids = torch.tensor([probe_ids])
    with torch.no_grad():
        want = loaded(ids).logits.float()
        got = saved(ids).logits.float()
    max_diff = float((want - got).abs().max())
    argmax_equal = bool(torch.equal(want.argmax(-1), got.argmax(-1)))
    if str(saved.dtype).removeprefix("torch.") != dtype:
        raise ConversionError(f"saved checkpoint loads as {saved.dtype}, expected {dtype}")
    if dtype == "float32" and max_diff > FLOAT32_LOGIT_TOLERANCE:
        raise ConversionError(f"saved checkpoint's logits differ from the GGUF model's by {max_diff:.3g}")
    if dtype == "float32" and not argmax_equal:
        raise ConversionError("saved checkpoint predicts different next tokens than the GGUF model")
    return {
        "probe_tokens": len(probe_ids),
        "max_abs_logit_diff": max_diff,
        "argmax_equal": argmax_equal,
        "model_type": saved.config.model_type,
        "architecture": (saved.config.architectures or [type(saved).__name__])[0],
        "num_parameters": int(saved.num_parameters()),
        "dtype": dtype,
    }


@contextmanager
def parsed_once(reader: GGUFReader, gguf_path: Path) -> Iterator[None]:
    """While transformers loads `gguf_path`, hand it `reader` (already parsed) instead of parsing the file again, and
    one gguf tensor-name map per architecture and layer count. transformers 5.5 parses a GGUF once for its config and
    once for its weights (gguf-py's GGUFReader: 5.4 s each for SmolLM2's 49k-token vocabulary on this project's VM)
    and builds the name map for every module it walks (~400 times, ~20 ms each): the conversion took 34 s with them,
    20 s without, its files byte-identical. Both are read-only (a reader is a view of the memory-mapped file); gguf's
    own functions are restored after."""
    import gguf

    make_reader, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    resolved = gguf_path.resolve()

    def reader_for(path: str | Path, *args: Any, **kwargs: Any) -> GGUFReader:
        if not args and not kwargs and Path(path).resolve() == resolved:
            return reader
        return make_reader(path, *args, **kwargs)

    setattr(gguf, "GGUFReader", reader_for)  # noqa: B010 - mypy refuses assigning a function to a class name
    gguf.get_tensor_name_map = functools.lru_cache(maxsize=None)(name_map)
    try:
        yield
    finally:
        setattr(gguf, "GGUFReader", make_reader)  # noqa: B010 - as above
        gguf.get_tensor_name_map = name_map


def convert(gguf_path: Path, out: Path, dtype: str) -> dict:
    import torch
    import transformers

    started = time.monotonic()
    reader = open_reader(gguf_path)
    info = read_gguf_info(gguf_path)
    out.mkdir(parents=True, exist_ok=True)
    with parsed_once(reader, gguf_path):
        mode, tokenizer = convert_tokenizer(reader, gguf_path, out, info)
        print(f"tokenizer: {mode}", flush=True)
        loaded, load_s = convert_model(gguf_path, out, dtype, info)
    del reader
    print(f"model: GGUF loaded and dequantized in {load_s:.1f}s, saved as {dtype} safetensors", flush=True)
    tok = check_tokenizer(out, info, tokenizer, builds_natively(info))
    print(f"tokenizer check: ok (add_bos={tok['add_bos_token']}, eos={tok['eos_token_id']})", flush=True)
    probe_ids = tokenizer(PROBE_TEXT, add_special_tokens=False)["input_ids"][:32]
    model = check_model(out, loaded, probe_ids, dtype)
    print(f"model check: ok (max |logit diff| {model['max_abs_logit_diff']:.3g})", flush=True)
    return {
        "converter_version": CONVERTER_VERSION,
        "gguf": info.to_json() | {"chat_template": bool(info.chat_template)},
        "tokenizer_mode": mode,
        "tokenizer": tok,
        "model_check": model,
        "files": sorted(p.name for p in out.iterdir()),
        "tool_versions": {"transformers": transformers.__version__, "torch": torch.__version__},
        "seconds": round(time.monotonic() - started, 3),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trtllm_forge.importer.gguf_to_hf", description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", type=Path, required=True, help="GGUF file to convert.")
    parser.add_argument("--out", type=Path, required=True, help="Directory to write the checkpoint into.")
    parser.add_argument("--dtype", choices=("float32", "float16", "bfloat16"), default="float32")
    parser.add_argument("--report", type=Path, required=True, help="JSON file to write the conversion facts into.")
    args = parser.parse_args(argv)
    try:
        report = convert(args.gguf, args.out, args.dtype)
    except ConversionError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 1
    for path in args.out.iterdir():
        path.chmod(0o644)  # save_pretrained leaves the weights 0600; servers may run as another user
    args.report.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
