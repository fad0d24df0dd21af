"""`render --check`: clean repositories pass; each seeded fault is found with file, line and a hint."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from cli_inprocess import run_in_process
from conftest import CONFIGS
from cpu_repository import ENGINES, write_clean_cpu_repository

from trtllm_forge.config import load_config
from trtllm_forge.engine_config import read_engine_config
from trtllm_forge.render.repository import write_repository
from trtllm_forge.render.validate import check_repository


@pytest.fixture(scope="module")
def clean_repo(tmp_path_factory) -> Path:
    return write_clean_cpu_repository(tmp_path_factory.mktemp("clean"))


@pytest.fixture
def repo(clean_repo, tmp_path) -> Path:
    copy = tmp_path / "model_repository"
    shutil.copytree(clean_repo, copy)
    return copy


def edit(path: Path, old: str, new: str, count: int = 1) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new, count))


def add_tensor(path: Path, kind: str, name: str, data_type: str, dims: str, optional: bool = False) -> None:
    """Declare one more `input` or `output` (kind) before the config's first one."""
    extra = "  optional: true\n" if optional else ""
    edit(path, f"{kind} {{", f'{kind} {{\n  name: "{name}"\n  data_type: {data_type}\n  dims: {dims}\n{extra}}}\n{kind} {{')


def errors(repo: Path) -> list:
    return [p for p in check_repository(repo) if p.level == "error"]


def assert_found(repo: Path, pattern: str, file_part: str) -> None:
    found = errors(repo)
    matching = [p for p in found if re.search(pattern, p.message)]
    assert matching, f"no error matching {pattern!r}; got {[p.message for p in found]}"
    assert all(file_part in p.file for p in matching), [p.file for p in matching]
    assert all(p.line >= 1 and p.hint for p in matching)


def test_clean_repositories_pass(clean_repo, tmp_path):
    assert errors(clean_repo) == []
    for example in ("llama3.1-70b-fp8-h200-tp4", "qwen2.5-7b-fp16-l40s-tp2"):
        rendered = write_repository(
            load_config(CONFIGS / f"{example}.yaml"),
            tmp_path,
            read_engine_config(ENGINES / example),
            "inflight_batcher_llm",
            tmp_path / example,
        )
        assert errors(rendered.repository) == []


def test_fault_unfilled_string_placeholder(repo):
    edit(
        repo / "preprocessing" / "config.pbtxt",
        'key: "add_special_tokens"\n  value: { string_value: "true" }',
        'key: "add_special_tokens"\n  value: { string_value: "${add_special_tokens}" }',
    )
    assert_found(repo, r"unfilled template placeholder \$\{add_special_tokens\}", "preprocessing/config.pbtxt")
    line = next(p.line for p in errors(repo) if "add_special_tokens" in p.message)
    assert "${add_special_tokens}" in (repo / "preprocessing" / "config.pbtxt").read_text().splitlines()[line - 1]


def test_fault_unfilled_typed_placeholder_does_not_parse(repo):
    edit(repo / "ensemble" / "config.pbtxt", "max_batch_size: 16", "max_batch_size: ${triton_max_batch_size}")
    assert_found(repo, r"does not parse as inference.ModelConfig", "ensemble/config.pbtxt")
    assert_found(repo, r"unfilled", "ensemble/config.pbtxt")


def test_fault_wrong_dtype_in_a_map(repo):
    path = repo / "tensorrt_llm" / "config.pbtxt"
    edit(path, 'name: "request_output_len"\n  data_type: TYPE_INT32', 'name: "request_output_len"\n  data_type: TYPE_INT64')
    assert_found(repo, r"'_REQUEST_OUTPUT_LEN' is TYPE_INT32 but input 'request_output_len' is TYPE_INT64", "ensemble/config.pbtxt")


def test_fault_wrong_dims_in_a_map(repo):
    edit(
        repo / "tensorrt_llm" / "config.pbtxt",
        'name: "stop_words_list"\n  data_type: TYPE_INT32\n  dims: [2, -1]',
        'name: "stop_words_list"\n  data_type: TYPE_INT32\n  dims: [3, -1]',
    )
    assert_found(repo, r"'_STOP_WORDS_IDS' has dims \[2, -1\] but input 'stop_words_list' has dims \[3, -1\]", "ensemble/config.pbtxt")


def test_fault_missing_version_directory(repo):
    shutil.rmtree(repo / "postprocessing" / "1")
    assert_found(repo, r"no version directory", "postprocessing")


def test_fault_name_differs_from_directory(repo):
    edit(repo / "postprocessing" / "config.pbtxt", 'name: "postprocessing"', 'name: "postproc"')
    assert_found(repo, r"model name 'postproc' differs from its directory 'postprocessing'", "postprocessing/config.pbtxt")


def _set_decoupled(path: Path, value: bool) -> None:
    edit(path, "decoupled: true", f"decoupled: {'true' if value else 'false'}")


def test_fault_streaming_without_decoupled(repo):
    _set_decoupled(repo / "tensorrt_llm" / "config.pbtxt", False)
    assert_found(
        repo, r"streaming is wired to tensorrt_llm, which is not decoupled.*tensorrt_llm_bls is decoupled", "ensemble/config.pbtxt"
    )


def test_a_repository_decoupled_nowhere_is_a_valid_non_streaming_one(repo):
    _set_decoupled(repo / "tensorrt_llm" / "config.pbtxt", False)
    _set_decoupled(repo / "tensorrt_llm_bls" / "config.pbtxt", False)
    assert errors(repo) == []
    assert any(p.level == "warning" and "streaming is wired" in p.message for p in check_repository(repo))


def test_fault_bls_decoupled_while_engine_is_not(repo):
    _set_decoupled(repo / "tensorrt_llm" / "config.pbtxt", False)
    assert_found(repo, r"tensorrt_llm_bls is decoupled but tensorrt_llm is not", "tensorrt_llm_bls/config.pbtxt")


@pytest.fixture
def draft_repo(tmp_path) -> Path:
    """The draft-target example rendered with its draft engine fixture (tensorrt_llm_draft beside tensorrt_llm)."""
    from trtllm_helpers import draft_engine_fixture

    example = "qwen2.5-7b-fp16-l40s-tp2"
    config, engine = load_config(CONFIGS / f"{example}.yaml"), read_engine_config(ENGINES / example)
    out = tmp_path / "draft-repo"
    write_repository(config, tmp_path, engine, "inflight_batcher_llm", out, draft_engine_fixture(example))
    assert errors(out) == []
    return out


def test_fault_bls_names_a_draft_model_that_is_not_there(draft_repo):
    shutil.rmtree(draft_repo / "tensorrt_llm_draft")
    assert_found(
        draft_repo, r"tensorrt_llm_draft_model_name 'tensorrt_llm_draft' is not in the repository", "tensorrt_llm_bls/config.pbtxt"
    )


def test_fault_decoupled_draft_model(draft_repo):
    edit(draft_repo / "tensorrt_llm_draft" / "config.pbtxt", "decoupled: false", "decoupled: true")
    assert_found(draft_repo, r"tensorrt_llm_draft is decoupled, but tensorrt_llm_bls calls", "tensorrt_llm_draft/config.pbtxt")


def test_fault_ensemble_batch_above_a_composing_model(repo):
    edit(repo / "ensemble" / "config.pbtxt", "max_batch_size: 16", "max_batch_size: 64")
    assert_found(repo, r"ensemble max_batch_size 64 is above preprocessing's 16", "ensemble/config.pbtxt")


def test_fault_ensemble_input_feeds_nothing(repo):
    add_tensor(repo / "ensemble" / "config.pbtxt", "input", "unused_knob", "TYPE_FP32", "[1]", optional=True)
    assert_found(repo, r"ensemble input 'unused_knob' feeds no step", "ensemble/config.pbtxt")


def test_fault_ensemble_output_never_produced(repo):
    add_tensor(repo / "ensemble" / "config.pbtxt", "output", "ghost_output", "TYPE_INT32", "[1]")
    assert_found(repo, r"ensemble output 'ghost_output' is produced by no step", "ensemble/config.pbtxt")


def test_fault_step_model_missing(repo):
    edit(repo / "ensemble" / "config.pbtxt", 'model_name: "postprocessing"', 'model_name: "detokenizer"')
    assert_found(repo, r"step model 'detokenizer' is not in the repository", "ensemble/config.pbtxt")


def test_fault_map_names_an_unknown_input(repo):
    edit(repo / "ensemble" / "config.pbtxt", 'key: "QUERY" value: "text_input"', 'key: "PROMPT" value: "text_input"')
    assert_found(repo, r"'PROMPT' is not an input of preprocessing", "ensemble/config.pbtxt")
    assert_found(repo, r"required input 'QUERY' is not mapped", "ensemble/config.pbtxt")


def test_fault_reshape_element_count(repo):
    edit(
        repo / "tensorrt_llm" / "config.pbtxt",
        'name: "input_lengths"\n  data_type: TYPE_INT32\n  dims: [1]\n  reshape: { shape: [] }',
        'name: "input_lengths"\n  data_type: TYPE_INT32\n  dims: [1]\n  reshape: { shape: [2] }',
    )
    assert_found(repo, r"reshape \[2\] has a different element count than dims \[1\]", "tensorrt_llm/config.pbtxt")


def test_fault_python_model_without_model_py(repo):
    (repo / "preprocessing" / "1" / "model.py").unlink()
    assert_found(repo, r"python model without model.py", "preprocessing/1")


def test_fault_directory_without_config(repo):
    (repo / "stray" / "1").mkdir(parents=True)
    assert_found(repo, r"model directory without config.pbtxt", "stray")


def test_fault_two_scheduling_choices_on_the_ensemble(repo):
    edit(repo / "ensemble" / "config.pbtxt", 'platform: "ensemble"', 'platform: "ensemble"\ndynamic_batching {}')
    assert_found(repo, r"does not parse", "ensemble/config.pbtxt")


def test_fault_warmup_on_the_ensemble(repo):
    edit(repo / "ensemble" / "config.pbtxt", 'platform: "ensemble"', 'platform: "ensemble"\nmodel_warmup { name: "w" batch_size: 1 }')
    assert_found(repo, r"model_warmup is not allowed on an ensemble", "ensemble/config.pbtxt")


def test_fault_duplicate_input(repo):
    add_tensor(repo / "postprocessing" / "config.pbtxt", "input", "SEQUENCE_LENGTH", "TYPE_INT32", "[-1]")
    assert_found(repo, r"input 'SEQUENCE_LENGTH' is declared twice", "postprocessing/config.pbtxt")


def test_duplicate_output_is_only_a_warning(repo):
    add_tensor(repo / "ensemble" / "config.pbtxt", "output", "batch_index", "TYPE_INT32", "[1]")
    problems = check_repository(repo)
    assert any(p.level == "warning" and "declared twice" in p.message for p in problems)
    assert errors(repo) == []


def test_cli_check_reports_every_problem_at_once(repo):
    edit(repo / "postprocessing" / "config.pbtxt", 'name: "postprocessing"', 'name: "postproc"')
    shutil.rmtree(repo / "preprocessing" / "1")
    result = run_in_process("render", "--check", str(repo))
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert any("model_repository/postprocessing/config.pbtxt:2: model name 'postproc'" in line for line in lines), lines
    assert any("model_repository/preprocessing:1: no version directory" in line for line in lines), lines
    assert "Traceback" not in result.stderr


def test_cli_check_json_on_a_clean_repository(clean_repo):
    result = run_in_process("render", "--check", str(clean_repo), "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["valid"] is True and not [p for p in report["problems"] if p["level"] == "error"]
