"""Property-based fuzzing (hypothesis) of config loading and `render --check`, in process.

For every generated config file or repository: no uncaught exception, exit code in {0, 1, 2}, every error
line names the file (and line) and the field, and each case stays within a CPU-time and memory bound.
A bounded number of cases runs in the suite (derandomized: the same cases every run); more with
FORGE_FUZZ_EXAMPLES=N (and FORGE_FUZZ_RANDOM=1 for new cases each run), e.g. `python scripts/fuzz_inputs.py`.
"""

from __future__ import annotations

import copy
import os
import re
import resource
import shutil
import time
from pathlib import Path

import pytest
import yaml
from cli_inprocess import run_in_process
from conftest import CONFIGS
from cpu_repository import write_clean_cpu_repository
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from trtllm_forge.config import ForgeConfig

EXAMPLES = int(os.environ.get("FORGE_FUZZ_EXAMPLES", "40"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,  # wall time on a busy machine says nothing; CPU time is bounded in the test itself
    derandomize=not os.environ.get("FORGE_FUZZ_RANDOM"),
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
MAX_CPU_SECONDS = 10.0  # per case; the unbounded parser once took 63 s and 1.9 GB for 443 bytes
MAX_RSS_GROWTH_KB = 600_000

BASE = yaml.safe_load((CONFIGS / "smollm2-cpu.yaml").read_text())

HOSTILE = [
    "[/x]",
    "[bold]x[/bold]",
    "[link=http://e]x",
    ":smile:",
    "../../x",
    "/etc/passwd",
    'a"\nname: "b',
    "-rf",
    "--privileged",
    "",
    " ",
    "~nosuchuser/m",
    "a\x00b",
    "é💥",
    "x" * 5000,
    "0.0.0.0",
    "::",
    "${x}",
    "%s%n",
    "\\",
    "{{ x }}",
    10**30,
    -1,
    0,
    2**63,
    float("inf"),
    float("nan"),
    -0.0,
    True,
    None,
    [],
    {},
    [1, -7],
    {"a": {"b": [1]}},
    "1e400",
    ".inf",
]


def _leaf_paths(model: type[BaseModel], prefix: tuple = ()) -> list[tuple]:
    paths = []
    for name, field in model.model_fields.items():
        if name == "config_dir":
            continue
        inner = [
            a for a in (field.annotation, *getattr(field.annotation, "__args__", ())) if isinstance(a, type) and issubclass(a, BaseModel)
        ]
        paths.append((*prefix, name))
        if inner:
            paths.extend(_leaf_paths(inner[0], (*prefix, name)))
    return paths


FIELDS = [
    *_leaf_paths(ForgeConfig),
    ("bench", "workloads", 0, "name"),
    ("bench", "workloads", 0, "concurrency"),
    ("bench", "workloads", 0, "slo_ms"),
    ("extra_section",),
    ("engine", "12"),
]

values = st.one_of(
    st.sampled_from(HOSTILE), st.text(max_size=40), st.integers(), st.floats(allow_nan=True), st.lists(st.integers(-10, 10), max_size=4)
)


def _set(data: dict, path: tuple, value) -> None:
    node = data
    for part in path[:-1]:
        if isinstance(part, int):
            if not isinstance(node, list) or len(node) <= part:
                return
            node = node[part]
            continue
        if not isinstance(node, dict):
            return
        node = node.setdefault(part, {})
    if isinstance(node, dict):
        node[int(path[-1]) if str(path[-1]).isdigit() else path[-1]] = value


TEXT_EDITS = ("none", "none", "duplicate_line", "truncate", "alias_bomb", "deep", "non_utf8", "tab", "anchor", "control_char")


def _edit_text(text: str, edit: str, position: int) -> bytes:
    lines = text.splitlines(keepends=True)
    at = position % max(len(lines), 1)
    if edit == "duplicate_line" and lines:
        lines.insert(at, lines[at])
    elif edit == "truncate":
        return text[: position % max(len(text), 1)].encode()
    elif edit == "alias_bomb":
        bomb = ["x-a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n"]
        for this, previous in zip("bcdefgh", "abcdefg", strict=False):
            bomb.append(f"x-{this}: &{this} [{', '.join(['*' + previous] * 9)}]\n")
        lines = bomb + lines
    elif edit == "deep":
        lines.append("x: " + "[" * (position % 3000 + 1) + "]" * (position % 3000 + 1) + "\n")
    elif edit == "non_utf8":
        data = "".join(lines).encode()
        cut = position % max(len(data), 1)
        return data[:cut] + b"\xff\xfe" + data[cut:]
    elif edit == "tab" and lines:
        lines[at] = "\t" + lines[at]
    elif edit == "anchor" and lines:
        lines.append("y: &r {a: *r}\n")
    elif edit == "control_char":  # YAML's reader refuses these before any parsing (issue #35.1)
        text = "".join(lines)
        cut = position % max(len(text), 1)
        return (text[:cut] + chr(position % 0x20 or 1) + text[cut:]).encode()
    return "".join(lines).encode()


# error: <file>[:<line>]: <field or (file)/(nesting)>: <problem>; <valid>   (invalid YAML names the line instead)
def _error_line(path: Path) -> re.Pattern:
    return re.compile(rf"^error: {re.escape(str(path))}(:\d+)?: (invalid YAML \(.+\); .+|top level is .+|\S.*?: .+)$")


def _assert_outcome(outcome, error_line: re.Pattern | None, cpu_seconds: float, allowed=(0, 1, 2)) -> None:
    assert outcome.exception is None, repr(outcome.exception)
    assert outcome.returncode in allowed, (outcome.returncode, outcome.stderr[-2000:])
    assert "Traceback" not in outcome.stderr and "error: internal" not in outcome.stderr, outcome.stderr[-2000:]
    assert cpu_seconds < MAX_CPU_SECONDS, cpu_seconds
    errors = [line for line in outcome.stderr.splitlines() if line.startswith("error: ")]
    if outcome.returncode == 2:
        assert errors, outcome.stderr
    for line in errors:
        assert len(line) < 2000
        if error_line is not None:
            assert error_line.match(line), line


@pytest.fixture(scope="module")
def rss_budget():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    yield
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert grown < MAX_RSS_GROWTH_KB, f"the process grew by {grown} kB while fuzzing"


@FUZZ
@given(
    mutations=st.lists(st.tuples(st.sampled_from(FIELDS), values), min_size=1, max_size=3),
    edit=st.sampled_from(TEXT_EDITS),
    position=st.integers(0, 10_000),
)
def test_config_loading_never_crashes_and_names_file_and_field(tmp_path_factory, rss_budget, mutations, edit, position):
    data = copy.deepcopy(BASE)
    for path, value in mutations:
        _set(data, path, value)
    config = tmp_path_factory.mktemp("fuzz") / "c.yaml"
    config.write_bytes(_edit_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True), edit, position))
    started = time.process_time()
    outcome = run_in_process("config", "validate", str(config))
    _assert_outcome(outcome, _error_line(config), time.process_time() - started, allowed=(0, 2))


@pytest.fixture(scope="module")
def clean_repository(tmp_path_factory) -> Path:
    return write_clean_cpu_repository(tmp_path_factory.mktemp("fuzz-clean"))


PBTXT_EDITS = (
    "data_type",
    "dims",
    "name",
    "truncate",
    "bytes",
    "parameter",
    "drop_version",
    "loop",
    "brace",
    "key",
    "huge_dims",  # issue #35.4: int64 extremes and element counts that wrap around in Triton's int64 arithmetic
    "reshape",
    "env_path",
)
HUGE_DIMS = ("[9223372036854775807]", "[4294967296, 4294967296]", "[4294967297, 4294967295]", "[-1, 9223372036854775807]", "[]")
RESHAPES = ("[]", "[-1]", "[4]", "[-1, -1]", "[4294967296, 4294967296, 3]", "[9223372036854775807, 2]")


def _edit_repository(repo: Path, model: str, edit: str, text_value: str, number: int, position: int) -> None:
    config = repo / model / "config.pbtxt"
    text = config.read_text(errors="replace") if config.is_file() else ""
    if edit == "data_type":
        text = re.sub(r"data_type: TYPE_\w+", f"data_type: {number}", text, count=1 + position % 3)
    elif edit == "dims":
        text = re.sub(r"dims: \[[^\]]*\]", f"dims: [{number}, {-number}]", text, count=1 + position % 3)
    elif edit == "name":
        text = text.replace(f'name: "{model}"', f'name: "{text_value}"', 1)
    elif edit == "truncate":
        text = text[: position % max(len(text), 1)]
    elif edit == "bytes":
        raw = text.encode()
        cut = position % max(len(raw), 1)
        config.write_bytes(raw[:cut] + bytes([number % 256, 0xFF]) + raw[cut:])
        return
    elif edit == "parameter":
        escaped = text_value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        text += f'\nparameters {{\n  key: "{escaped}"\n  value: {{ string_value: "" }}\n}}\n'
    elif edit == "drop_version":
        shutil.rmtree(repo / model / "1", ignore_errors=True)
        return
    elif edit == "loop":
        (repo / model / "1").mkdir(parents=True, exist_ok=True)
        for link in (repo / model / "1" / "loop", repo / f"{model}-link"):
            if not link.is_symlink():
                link.symlink_to(link)
    elif edit == "huge_dims":
        text = re.sub(r"dims: \[[^\]]*\]", f"dims: {HUGE_DIMS[position % len(HUGE_DIMS)]}", text, count=1 + position % 3)
    elif edit == "reshape":
        shape = RESHAPES[position % len(RESHAPES)]
        text = re.sub(r"(dims: \[[^\]]*\])", rf"\1\n  reshape: {{ shape: {shape} }}", text, count=1 + position % 3)
    elif edit == "env_path":  # a NUL, a newline or a control character somewhere in EXECUTION_ENV_PATH
        escape = ("\\000", "\\n", "\\001", "")[position % 4]
        text += f'\nparameters {{\n  key: "EXECUTION_ENV_PATH"\n  value: {{ string_value: "{escape}/x{escape}{text_value[:5]}" }}\n}}\n'
    elif edit == "brace":
        text = text.replace("}", "", 1 + position % 3)
    elif edit == "key":
        text = text.replace('key: "', f'key: "{text_value[:20]}', 1)
    config.write_text(text)


@settings(FUZZ, max_examples=max(10, EXAMPLES // 2))  # each case copies a repository
@given(
    model=st.sampled_from(["ensemble", "preprocessing", "tensorrt_llm", "postprocessing", "tensorrt_llm_bls"]),
    edits=st.lists(st.sampled_from(PBTXT_EDITS), min_size=1, max_size=3),
    text_value=st.one_of(st.sampled_from([v for v in HOSTILE if isinstance(v, str)]), st.text(max_size=30)),
    number=st.integers(-(2**31), 2**31),
    position=st.integers(0, 100_000),
)
def test_render_check_never_crashes_and_names_file_and_line(
    tmp_path_factory, clean_repository, rss_budget, model, edits, text_value, number, position
):
    repo = tmp_path_factory.mktemp("fuzz-repo") / "model_repository"
    shutil.copytree(clean_repository, repo, symlinks=True)
    for edit in edits:
        _edit_repository(repo, model, edit, text_value, number, position)
    started = time.process_time()
    outcome = run_in_process("render", "--check", str(repo))
    # Every problem is `error: <file in the repository>:<line>: <what>; <fix>`.
    line = re.compile(r"^error: model_repository(/[^:]+)?:\d+: .+; .+$", re.S)
    _assert_outcome(outcome, line, time.process_time() - started, allowed=(0, 2))


def test_a_control_character_in_a_config_is_a_config_error_naming_file_and_line(tmp_path):
    """Issue #35.1: PyYAML's reader refuses control characters when the loader is made; that is bad input (exit 2)."""
    config = tmp_path / "c.yaml"
    config.write_bytes(b'model: {source: smollm2-135m}\nname: "a\x01b"\n')
    outcome = run_in_process("config", "validate", str(config))
    assert outcome.exception is None and outcome.returncode == 2, outcome.stderr
    assert outcome.stderr.startswith(f"error: {config}:2: (file): holds a character YAML does not allow (#x0001"), outcome.stderr
    assert "internal" not in outcome.stderr


def test_a_file_name_with_a_newline_stays_on_the_error_line(tmp_path):
    """Issue #35.2: the file name is escaped like the rest of the message, so the error is one line."""
    config = tmp_path / "a\nb.yaml"
    config.write_text("model: {source: nope}\n")
    outcome = run_in_process("config", "validate", str(config))
    assert outcome.returncode == 2, outcome.stderr
    errors = outcome.stderr.strip().splitlines()
    assert len(errors) == 1 and errors[0].startswith(f"error: {tmp_path}/a\\x0ab.yaml: "), outcome.stderr


def test_a_full_disk_is_one_line_naming_the_file_and_leaves_no_temp_file(full_disk):
    """Issue #35.3 for every stage that writes: the OSError of a full disk names its file (exit 1, not 'internal')."""
    outcome = run_in_process("plan", str(CONFIGS / "smollm2-cpu.yaml"), "--workdir", str(full_disk / "work"))
    assert outcome.exception is None and outcome.returncode == 1, outcome.stderr
    assert f"could not write {full_disk}/work/plan/plan.json: No space left on device" in outcome.stderr, outcome.stderr
    assert "internal" not in outcome.stderr
    assert not [p for p in full_disk.rglob("*") if ".tmp" in p.name], sorted(map(str, full_disk.rglob("*")))
