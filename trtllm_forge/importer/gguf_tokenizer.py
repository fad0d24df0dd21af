"""A Hugging Face tokenizer from a GGUF file's vocabulary, with the GGUF's own special-token rules.

transformers 5.5.4 loads the SmolLM2 GGUF tokenizer as a CodeLlama tokenizer that prepends BOS although
the GGUF says `add_bos_token: false`, takes `<|im_start|>` as EOS, leaves out the digit splitting of the
"smollm" pre-tokenizer, and saves a tokenizer that re-loads into a different tokenization. So for
byte-level BPE vocabularies ("gpt2" tokenizer model) with a pre-tokenizer we know, the tokenizer is
built here from the GGUF's tokens and merges. Other vocabularies fall back to transformers' GGUF
tokenizer with the special-token rules corrected; that fallback is checked by re-loading what was saved.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from trtllm_forge.importer.gguf_meta import GGUFInfo

if TYPE_CHECKING:
    from gguf import GGUFReader
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

# llama.cpp pre-tokenizer names whose splitting we rebuild: "smollm" isolates every digit before the
# GPT-2 regex; "gpt2"/"default" use the GPT-2 regex alone.
KNOWN_PRE_TOKENIZERS = {"smollm", "gpt2", "gpt-2", "default"}
TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4
PROBE_TEXT = "The quick brown fox jumps over the lazy dog. Hello world, how are you today?"


def builds_natively(info: GGUFInfo) -> bool:
    return info.tokenizer_model == "gpt2" and (info.tokenizer_pre or "default") in KNOWN_PRE_TOKENIZERS


def _token(tokens: list[str], index: int | None) -> str | None:
    return tokens[index] if index is not None and 0 <= index < len(tokens) else None


def build_bpe_tokenizer(reader: GGUFReader, info: GGUFInfo) -> PreTrainedTokenizerFast:
    """PreTrainedTokenizerFast for a byte-level BPE vocabulary stored in the GGUF file."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    fields = reader.fields
    tokens = list(fields["tokenizer.ggml.tokens"].contents())
    types = list(fields["tokenizer.ggml.token_type"].contents()) if "tokenizer.ggml.token_type" in fields else []
    merges = [tuple(m.split(" ", 1)) for m in fields["tokenizer.ggml.merges"].contents()]
    bpe = models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, fuse_unk=False, byte_fallback=False)
    backend = Tokenizer(bpe)
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if (info.tokenizer_pre or "default") == "smollm":
        backend.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    else:
        backend.pre_tokenizer = byte_level
    backend.decoder = decoders.ByteLevel()
    # ByteLevel post-processing only trims offsets: no BOS/EOS is added, as the GGUF asks (checked below).
    backend.post_processor = processors.ByteLevel(trim_offsets=False)
    special = [
        AddedToken(tokens[i], special=(kind == TOKEN_TYPE_CONTROL), normalized=False)
        for i, kind in enumerate(types)
        if kind in (TOKEN_TYPE_CONTROL, TOKEN_TYPE_USER_DEFINED)
    ]
    backend.add_special_tokens([t for t in special if t.special])
    backend.add_tokens([t for t in special if not t.special])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=_token(tokens, info.bos_token_id),
        eos_token=_token(tokens, info.eos_token_id),
        unk_token=_token(tokens, info.unk_token_id),
        pad_token=_token(tokens, info.pad_token_id),
        model_max_length=info.context_length or 2048,
        clean_up_tokenization_spaces=False,
    )
    if info.add_bos_token or info.add_eos_token:
        _add_template(tokenizer, info, tokens)
    return tokenizer


def _add_template(tokenizer: Tokenizer, info: GGUFInfo, tokens: list[str]) -> None:
    from tokenizers import processors

    bos = _token(tokens, info.bos_token_id) if info.add_bos_token else None
    eos = _token(tokens, info.eos_token_id) if info.add_eos_token else None
    single = " ".join(x for x in (bos and f"{bos}:0", "$A:0", eos and f"{eos}:0") if x)
    pair = " ".join(x for x in (single, bos and f"{bos}:1", "$B:1", eos and f"{eos}:1") if x)
    specials = [(t, tokens.index(t)) for t in (bos, eos) if t]
    tokenizer.backend_tokenizer.post_processor = processors.TemplateProcessing(single=single, pair=pair, special_tokens=specials)


def fallback_tokenizer(gguf_path: Path, info: GGUFInfo) -> PreTrainedTokenizerBase:
    """transformers' own GGUF tokenizer, special tokens corrected from the GGUF metadata."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    vocab_size = len(tokenizer)
    for attr, index in (
        ("bos_token", info.bos_token_id),
        ("eos_token", info.eos_token_id),
        ("pad_token", info.pad_token_id),
        ("unk_token", info.unk_token_id),
    ):
        if index is not None and 0 <= index < vocab_size:
            setattr(tokenizer, attr, tokenizer.convert_ids_to_tokens(index))
    if hasattr(tokenizer, "add_bos_token") and info.add_bos_token is not None:
        tokenizer.add_bos_token = info.add_bos_token
    if hasattr(tokenizer, "add_eos_token") and info.add_eos_token is not None:
        tokenizer.add_eos_token = info.add_eos_token
    return tokenizer


def strip_bos_from_saved(out_dir: Path, bos_token: str | None) -> bool:
    """Remove a BOS the saved tokenizer.json post-processor would prepend; True if something changed."""
    path = out_dir / "tokenizer.json"
    if not path.is_file() or bos_token is None:
        return False
    data = json.loads(path.read_text())
    post = data.get("post_processor") or {}
    if post.get("type") != "TemplateProcessing":
        return False

    def keep(item: dict) -> bool:
        return item.get("SpecialToken", {}).get("id") != bos_token

    post["single"] = [i for i in post["single"] if keep(i)]
    post["pair"] = [i for i in post["pair"] if keep(i)]
    post.get("special_tokens", {}).pop(bos_token, None)
    data["post_processor"] = post
    path.write_text(json.dumps(data, ensure_ascii=False, indent=2))
    config_path = out_dir / "tokenizer_config.json"
    if config_path.is_file():
        config = json.loads(config_path.read_text())
        config["add_bos_token"] = False
        config_path.write_text(json.dumps(config, ensure_ascii=False, indent=2))
    return True
