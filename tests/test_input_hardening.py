"""Hostile config files and repositories: each gives one line naming the file, line and field and what would
be valid, exit 2; never a traceback, never an unbounded parse, never markup interpreted in user text."""

from __future__ import annotations

import json
import resource
import shutil
import time
from pathlib import Path

import pytest
from cli_inprocess import run_in_process
from conftest import REPO
from cpu_repository import write_clean_cpu_repository

from trtllm_forge.config import load_config
from trtllm_forge.errors import ConfigError
from trtllm_forge.ui import protect

MINIMAL = "model:\n  source: smollm2-135m\nengine:\n  backend: openvino\n"


def one_error(outcome, *needles: str) -> str:
    assert outcome.exception is None, repr(outcome.exception)
    assert outcome.returncode == 2, (outcome.returncode, outcome.stderr)
    lines = [line for line in outcome.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), outcome.stderr
    assert "Traceback" not in outcome.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def validate(path: Path):
    return run_in_process("config", "validate", str(path))


# --- the YAML file -------------------------------------------------------------------------------------


def test_rich_markup_in_a_path_and_a_value_is_printed_as_written(tmp_path):
    folder = tmp_path / "a[/x][bold]"
    folder.mkdir(parents=True)
    path = folder / "c.yaml"
    path.write_text(MINIMAL.replace("smollm2-135m", '"m[/x]/[link=http://x]y/[bold]b[/bold]"'))
    outcome = validate(path)
    assert outcome.returncode == 0, outcome.stderr
    assert f"{path}: valid (openvino, m[/x]/[link=http://x]y/[bold]b[/bold])" in outcome.stderr


def test_markup_protection_keeps_our_styles_and_escapes_the_rest():
    assert protect("[green]✓[/green] a[/x]") == "[green]✓[/green] a\\[/x]"
    assert protect("[dim]$ ls [/x][/dim]") == "[dim]$ ls \\[/x][/dim]"
    assert protect("[red]x") == "\\[red]x"  # unbalanced: not ours
    assert protect("[link=http://e]t[/link]") == "\\[link=http://e]t\\[/link]"


def test_non_utf8_file(write_config):
    path = write_config("")
    path.write_bytes(b"model:\n  source: smollm2-135m\n  name: \xff\xfe\n")
    one_error(validate(path), f"{path}:3:", "not UTF-8", "save the file as UTF-8")


def test_deep_nesting_stops_quickly(write_config):
    path = write_config("model: {source: smollm2-135m}\nx: " + "[" * 50_000 + "]" * 50_000 + "\n")
    one_error(validate(path), f"{path}:2:", "nested deeper than 32 levels")


def test_integer_with_4301_digits(write_config):
    path = write_config("model: {source: smollm2-135m}\nengine:\n  max_batch_size: " + "9" * 4301 + "\n")
    one_error(validate(path), f"{path}:3:", "engine.max_batch_size", "4,301 digits", "at most 18 digits")


def test_home_of_an_unknown_user(write_config):
    path = write_config("model:\n  source: ~nosuchuser/m\n")
    one_error(validate(path), f"{path}:2:", "model.source", "~nosuchuser is not a user")


def test_infinite_and_nan_numbers(write_config):
    path = write_config(MINIMAL + "deploy: {ready_timeout_s: .inf}\n")
    one_error(validate(path), f"{path}:5:", "deploy.ready_timeout_s", "finite")


@pytest.mark.parametrize("heads,shown", [("0", "is 0"), ("1e400", "is inf"), ('"x"', "is 'x'")])
def test_checkpoint_config_json_with_impossible_head_count(tmp_path, heads, shown):
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text(
        f'{{"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "vocab_size": 100, "num_attention_heads": {heads}}}'
    )
    path = tmp_path / "c.yaml"
    path.write_text(MINIMAL.replace("smollm2-135m", "ckpt"))
    one_error(validate(path), f"{checkpoint / 'config.json'}: num_attention_heads: {shown}", "a whole number from 1")


def _bounded(seconds: float, call):
    started = time.process_time()
    result = call()
    return result, time.process_time() - started


def test_alias_bomb_is_refused_in_bounded_time_and_memory(write_config):
    lines = ["model: {source: smollm2-135m}", 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for this, previous in zip("bcdefghi", "abcdefgh", strict=False):
        lines.append(f"{this}: &{this} [" + ",".join([f"*{previous}"] * 9) + "]")
    path = write_config("\n".join(lines) + "\n")
    assert path.stat().st_size < 500
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    outcome, cpu_seconds = _bounded(10, lambda: validate(path))
    grown_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    line = one_error(outcome, str(path), "expands to more than 100,000 values")
    assert len(line) < 300
    # Generous bounds (the unbounded parse took 63 s and 1.9 GB): CPU time, not wall time, on a busy machine.
    assert cpu_seconds < 20 and grown_kb < 300_000, (cpu_seconds, grown_kb)


def test_recursive_alias(write_config):
    one_error(validate(write_config("model: {source: smollm2-135m}\nx: &a [*a]\n")), "x[0]", "alias refers to a value that contains it")


def test_error_lines_never_echo_a_large_input(write_config):
    path = write_config(MINIMAL + "hardware: {gpu: " + "x" * 100_000 + "}\n")
    outcome = validate(path)
    assert outcome.returncode == 2
    assert max(len(line) for line in outcome.stderr.splitlines()) < 1000


def test_duplicate_keys_name_the_key_and_both_lines(write_config):
    path = write_config("model:\n  source: smollm2-135m\nengine:\n  backend: openvino\n  backend: tensorrt-llm\n")
    one_error(validate(path), f"{path}:5:", "engine.backend", "duplicate key 'backend' (first at line 4)")


def test_merge_keys_may_override(write_config):
    path = write_config("base: &b {backend: openvino, max_batch_size: 4}\n".replace("base", "x-base") + MINIMAL)
    assert validate(path).returncode == 2  # x-base is an unknown top-level key, but no crash and no duplicate error
    merged = write_config("model: {source: smollm2-135m}\nengine:\n  <<: {backend: openvino, max_batch_size: 4}\n  max_batch_size: 8\n")
    assert load_config(merged).engine.max_batch_size == 8


def test_integer_keys_print_as_written(write_config):
    path = write_config(MINIMAL + "  12: 3\n")
    line = one_error(validate(path), f"{path}:5:", "engine.12: unknown key")
    assert "[12]" not in line


def test_errors_name_the_file_and_line_of_the_field(write_config):
    path = write_config(MINIMAL + "  max_batch_size: 0\n")
    one_error(validate(path), f"{path}:5: engine.max_batch_size:")


def test_minimal_openvino_config_without_quantization_builds(write_config, tmp_path):
    config = load_config(write_config(MINIMAL))
    assert config.quantization.algorithm == "none" and config.engine.kv_cache_type == "paged"
    outcome = run_in_process("build-engine", str(write_config(MINIMAL)), "--dry-run", "--workdir", str(tmp_path / "wd"))
    assert outcome.returncode == 0, outcome.stderr
    assert "QuantAlgorithm" not in outcome.stderr and "is not available" not in outcome.stderr


# --- names and addresses -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["../../x", "/abs/x", "a/b", "..", ".hidden", "-rf", 'a"\nname: "b', "a b", "x" * 129, ""])
def test_model_names_are_single_safe_directory_names(write_config, name):
    path = write_config(MINIMAL + "triton:\n  model_names:\n    ensemble: " + json.dumps(name) + "\n")
    one_error(validate(path), f"{path}:", "triton.model_names.ensemble", "not a valid model or deployment name")


def test_deployment_name_cannot_leave_the_workdir(write_config):
    path = write_config("name: ../../x\n" + MINIMAL)
    one_error(validate(path), f"{path}:1: name:", "not a valid model or deployment name")


def test_a_file_name_that_is_no_valid_name_asks_for_name(tmp_path):
    path = tmp_path / "-bad name.yaml"
    path.write_text(MINIMAL)
    one_error(validate(path), "name: unset, and the file name '-bad name' is not a valid name")


def test_two_models_with_one_name(write_config):
    path = write_config(MINIMAL + "triton:\n  model_names:\n    bls: ensemble\n")
    one_error(validate(path), "triton.model_names", "every model needs its own directory")


@pytest.mark.parametrize("image", ["--privileged", "ubuntu --privileged", "Ubuntu:latest", "a b", "", "x:" + "t" * 200])
def test_image_must_be_an_image_reference(write_config, image):
    path = write_config(MINIMAL + "deploy:\n  image: " + json.dumps(image) + "\n")
    one_error(validate(path), f"{path}:6: deploy.image:", "not an image reference")


def test_valid_image_references(write_config):
    for image in ("nvcr.io/nvidia/tritonserver:25.10-trtllm-python-py3", "localhost:5000/forge/triton:v1", "ubuntu@sha256:" + "a" * 64):
        assert load_config(write_config(MINIMAL + f"deploy:\n  image: {image}\n")).deploy.image == image


@pytest.mark.parametrize("address", ['""', "-h", "999.1.1.1", "10.0.0", "a..b", "host name"])
def test_bind_address_is_validated(write_config, address):
    path = write_config(MINIMAL + f"triton:\n  bind_address: {address}\n")
    one_error(validate(path), f"{path}:6: triton.bind_address:", "not an IP address or host name")


def test_every_interface_is_allowed_with_a_warning(write_config):
    outcome = validate(write_config(MINIMAL + "triton:\n  bind_address: 0.0.0.0\n"))
    assert outcome.returncode == 0, outcome.stderr
    assert "warning:" in outcome.stderr and "listens on every interface" in outcome.stderr
    for address in ("127.0.0.1", "::1", "localhost", "serving-host.example.com"):
        outcome = validate(write_config(MINIMAL + f"triton:\n  bind_address: '{address}'\n"))
        assert outcome.returncode == 0 and "warning" not in outcome.stderr, outcome.stderr


def test_render_never_writes_outside_the_repository(write_config, tmp_path):
    """The name checks run at load: a hostile name never reaches render, so nothing lands outside."""
    path = write_config(MINIMAL + "triton:\n  model_names:\n    preprocessing: ../../escaped\n")
    outcome = run_in_process(
        "render", str(path), "--engine-dir", str(REPO / "tests" / "fixtures" / "engines" / "smollm2-cpu"), "--workdir", str(tmp_path / "wd")
    )
    one_error(outcome, "triton.model_names.preprocessing")
    assert not list(tmp_path.rglob("escaped"))


# --- render --check --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def clean_repository(tmp_path_factory) -> Path:
    return write_clean_cpu_repository(tmp_path_factory.mktemp("clean"))


@pytest.fixture
def repository(clean_repository, tmp_path) -> Path:
    copy = tmp_path / "model_repository"
    shutil.copytree(clean_repository, copy)
    return copy


def check(directory: Path):
    return run_in_process("render", "--check", str(directory))


def test_check_prints_a_markup_parameter_key_as_written(repository):
    config = repository / "preprocessing" / "config.pbtxt"
    config.write_text(config.read_text() + '\nparameters {\n  key: "[/x]"\n  value: { string_value: "" }\n}\n')
    outcome = check(repository)
    assert outcome.exception is None and outcome.returncode == 0, outcome.stderr
    assert "parameter '[/x]' is empty" in outcome.stderr


def test_check_unknown_data_type(repository):
    config = repository / "preprocessing" / "config.pbtxt"
    config.write_text(config.read_text().replace("data_type: TYPE_STRING", "data_type: 99", 1))
    outcome = check(repository)
    assert outcome.returncode == 2 and outcome.exception is None
    assert (
        "preprocessing/config.pbtxt:6: input 'QUERY' has data_type 99, which is not a Triton data type; one of TYPE_BOOL" in outcome.stderr
    )


@pytest.mark.parametrize("dims", ["[-7]", "[0]"])
def test_check_rejects_dims_other_than_minus_one_or_positive(repository, dims):
    config = repository / "preprocessing" / "config.pbtxt"
    config.write_text(config.read_text().replace("dims: [1]", f"dims: {dims}", 1))
    outcome = check(repository)
    assert outcome.returncode == 2
    assert (
        f"input 'QUERY' has dims {dims.replace('[', '[').replace(']', ']')}; each dimension is a size of at least 1, or -1"
        in outcome.stderr
    )


def test_check_a_symlink_loop(tmp_path):
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    one_error(check(loop), "error: loop:1: cannot be read (Too many levels of symbolic links)")


def test_config_error_keeps_the_source_it_was_read_from():
    error = ConfigError("a.b", "bad", "fix").located("c.yaml:3")
    assert str(error.format_message()) == "c.yaml:3: a.b: bad; fix" and error.where == "a.b"


def test_check_a_control_character_in_config_pbtxt_stays_one_line(repository):
    """Found by the fuzz test: protobuf's parse error quoted a vertical tab, which split the error line."""
    config = repository / "ensemble" / "config.pbtxt"
    config.write_bytes(b"\x0b\xff" + config.read_bytes())
    outcome = check(repository)
    assert outcome.returncode == 2 and outcome.exception is None
    errors = [line for line in outcome.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith("error: model_repository/ensemble/config.pbtxt:1: does not parse"), errors
    assert "\\x0b" in errors[0]


def test_check_a_data_type_beyond_int32(repository):
    """Found by the fuzz test: protobuf raises ValueError (not ParseError) for an enum value beyond int32."""
    config = repository / "preprocessing" / "config.pbtxt"
    config.write_text(config.read_text().replace("data_type: TYPE_STRING", "data_type: 2147483648", 1))
    line = one_error(check(repository), "model_repository/preprocessing/config.pbtxt:7: does not parse as inference.ModelConfig")
    assert "2147483648" in line


# --- render --check agrees with Triton (issue #35.4) --------------------------------------------------------

BIG = 2**63 - 1
ENV = str(REPO / ".venv")
# model name -> (config.pbtxt fields, what Triton 2.51 said when it loaded the model: "loaded" or its refusal).
# The test loads all of them in the real server and checks both columns: Triton still says this, and render
# --check reports an error for exactly the models Triton refuses.
AGAINST_TRITON = {
    "dims_int64_max": ({"input_dims": f"[{BIG}]", "output_dims": f"[{BIG}]"}, "loaded"),
    "dims_int64_max_batched": ({"input_dims": f"[{BIG}, {BIG}]", "max_batch_size": 8}, "loaded"),
    "no_dims": ({"input_dims": "[]"}, "model input 'INPUT' must specify 'dims'"),
    "reshape_wraps_equal": ({"input_dims": "[4294967296, 4294967296]", "reshape": "[4294967296, 4294967296, 3]"}, "loaded"),
    "reshape_wraps_different": (
        {"input_dims": "[4294967296, 4294967296]", "reshape": "[1]"},
        "model input 'INPUT' has different size for dims and reshape",
    ),
    "reshape_wraps_to_minus_one": ({"input_dims": "[4294967297, 4294967295]", "reshape": "[4294967297, 4294967295, 1]"}, "loaded"),
    "reshape_int64_max": ({"input_dims": f"[{BIG}, 2]", "reshape": f"[2, {BIG}]"}, "loaded"),
    "reshape_empty_unbatched": (
        {"input_dims": "[1]", "reshape": "[]"},
        "model input 'INPUT' cannot have empty reshape for non-batching model as scalar tensors are not supported",
    ),
    "reshape_empty_batched": ({"input_dims": "[1]", "reshape": "[]", "max_batch_size": 4}, "loaded"),
    "reshape_variable_to_fixed": ({"input_dims": "[-1]", "reshape": "[4]"}, "model input 'INPUT' has different size for dims and reshape"),
    "reshape_variable_count": (
        {"input_dims": "[-1, -1]", "reshape": "[-1]"},
        "model input 'INPUT' has different number of variable-size dimensions for dims and reshape",
    ),
    "reshape_variable_runs": (
        {"input_dims": "[2, -1, 3]", "reshape": "[3, -1, 2]"},
        "model input 'INPUT' has different size for dims and reshape",
    ),
    "reshape_variable_runs_equal": ({"input_dims": "[2, 3, -1]", "reshape": "[6, -1]"}, "loaded"),
    "reshape_variable_runs_wrap": (
        {"input_dims": "[4294967296, 4294967296, -1]", "reshape": "[5, -1]"},
        "model input 'INPUT' has different size for dims and reshape",
    ),
    "output_reshape": ({"output_dims": "[2, 3]", "output_reshape": "[5]"}, "model output 'OUTPUT' has different size for dims and reshape"),
    "env_nul_inside": ({"env": ENV + "\\000junk"}, "loaded"),
    "env_nul_first": ({"env": "\\000" + ENV}, "Failed to get the canonical path for "),  # the log line ends at the NUL
}


def _write_case(root: Path, name: str, fields: dict) -> None:
    from conftest import _ECHO_MODEL

    reshape = f"reshape: {{ shape: {fields['reshape']} }}" if "reshape" in fields else ""
    output_reshape = f"reshape: {{ shape: {fields['output_reshape']} }}" if "output_reshape" in fields else ""
    env = f'parameters {{ key: "EXECUTION_ENV_PATH" value: {{ string_value: "{fields["env"]}" }} }}' if "env" in fields else ""
    (root / name / "1").mkdir(parents=True)
    (root / name / "1" / "model.py").write_text(_ECHO_MODEL)
    (root / name / "config.pbtxt").write_text(
        f'name: "{name}"\nbackend: "python"\nmax_batch_size: {fields.get("max_batch_size", 0)}\n'
        f'input [ {{ name: "INPUT" data_type: TYPE_STRING dims: {fields.get("input_dims", "[-1]")} {reshape} }} ]\n'
        f'output [ {{ name: "OUTPUT" data_type: TYPE_STRING dims: {fields.get("output_dims", "[-1]")} {output_reshape} }} ]\n'
        f"instance_group [ {{ kind: KIND_CPU count: 1 }} ]\n{env}\n"
    )


def _triton_verdicts(log: str) -> dict[str, str]:
    """Model -> "loaded" or Triton's reason, from its log (a config Triton refuses never reaches the status table)."""
    import re

    verdicts = {name: "loaded" for name in re.findall(r"successfully loaded '([^']+)'", log)}
    verdicts.update(re.findall(r"Poll failed for model directory '([^']+)': (.*?) for \1\"", log))
    verdicts.update(re.findall(r"failed to load '([^']+)' version \d+: \w+: (.*?)\"", log))
    return verdicts


@pytest.fixture(scope="module")
def against_triton(tmp_path_factory) -> tuple[dict[str, str], dict[str, list[str]]]:
    """Triton's verdict per case (one server start for all) and render --check's errors per case."""
    from conftest import forge_test_config

    from trtllm_forge.deploy import start_server
    from trtllm_forge.deploy.launch import plan_launch
    from trtllm_forge.errors import StepError
    from trtllm_forge.render.validate import check_repository

    repository = tmp_path_factory.mktemp("against-triton") / "model_repository"
    for name, (fields, _) in AGAINST_TRITON.items():
        _write_case(repository, name, fields)
    workdir = tmp_path_factory.mktemp("against-triton-wd")
    config = forge_test_config()
    with pytest.raises(StepError, match="exited with code"):  # it loads every model, then exits: some are refused
        start_server(config, workdir, repository, ready_timeout_s=120)
    log = plan_launch(config, workdir, repository).log.read_text(errors="replace")
    errors: dict[str, list[str]] = {}
    for problem in check_repository(repository):
        if problem.level == "error":
            errors.setdefault(Path(problem.file).parts[1], []).append(problem.message)
    return _triton_verdicts(log), errors


@pytest.mark.parametrize("name", list(AGAINST_TRITON))
def test_check_refuses_what_triton_refuses_and_accepts_what_it_loads(against_triton, name):
    verdicts, errors = against_triton
    said = AGAINST_TRITON[name][1]
    assert verdicts.get(name) == said, (name, verdicts.get(name))
    if said == "loaded":
        assert name not in errors, errors.get(name)
    else:
        assert len(errors.get(name, [])) == 1, (name, errors.get(name))


def test_check_names_file_line_and_field_of_a_reshape_triton_refuses(repository):
    config = repository / "tensorrt_llm" / "config.pbtxt"
    text = config.read_text()
    config.write_text(text.replace("dims: [-1, -1]\n  optional: true", "dims: [-1, -1]\n  reshape: { shape: [-1] }\n  optional: true", 1))
    line = one_error(check(repository), "model_repository/tensorrt_llm/config.pbtxt:", "input 'encoder_input_features'")
    assert "another number of variable-size (-1) dimensions" in line


def test_check_escapes_a_nul_byte_in_execution_env_path(repository):
    config = repository / "preprocessing" / "config.pbtxt"
    text = config.read_text()
    config.write_text(
        text.replace(
            'key: "EXECUTION_ENV_PATH"\n  value: { string_value: "', 'key: "EXECUTION_ENV_PATH"\n  value: { string_value: "\\000', 1
        )
    )
    line = one_error(check(repository), "model_repository/preprocessing/config.pbtxt:", "starts with a NUL byte")
    assert "\\x00" in line and "\x00" not in line
