"""CLI conventions every command must keep: lazy imports, exit codes, one-line errors, --help everywhere."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from cli_inprocess import run_in_process
from conftest import CONFIGS

from trtllm_forge.cli import cli

HEAVY_MODULES = ["torch", "transformers", "openvino", "openvino_genai", "tensorrt_llm", "tensorrt", "optimum", "tritonclient"]

BLOCKER_SETUP = f"""
import sys
BLOCKED = {HEAVY_MODULES!r}
class Blocker:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in BLOCKED:
            raise ImportError(f'blocked for this test: {{name}}')
        return None
sys.meta_path.insert(0, Blocker())
from trtllm_forge.cli import main
"""
BLOCKER = (
    BLOCKER_SETUP
    + """
sys.argv = ['trtllm-forge'] + sys.argv[1:]
main()
"""
)
# Every command's --help in one interpreter with the blocker (one start-up instead of one per command):
# prints {" ".join(path): {"returncode", "stdout", "stderr"}} as JSON.
BLOCKER_EVERY_HELP = (
    BLOCKER_SETUP
    + """
import io, json
from contextlib import redirect_stderr, redirect_stdout
results = {}
for path in json.loads(sys.argv[1]):
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            main([*path, '--help'])
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except Exception as exc:
            code, err = -1, io.StringIO(f'{type(exc).__name__}: {exc}')
    results[' '.join(path)] = {'returncode': code, 'stdout': out.getvalue(), 'stderr': err.getvalue()}
sys.__stdout__.write(json.dumps(results))
"""
)


def run_blocked(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BLOCKER, *args], capture_output=True, text=True, timeout=120)


def all_command_paths() -> list[list[str]]:
    paths = []

    def walk(group, prefix):
        for name, command in group.commands.items():
            paths.append([*prefix, name])
            if hasattr(command, "commands"):
                walk(command, [*prefix, name])

    walk(cli, [])
    return paths


def test_help_without_heavy_modules():
    result = run_blocked("--help")
    assert result.returncode == 0, result.stderr
    assert "config" in result.stdout


@pytest.fixture(scope="module")
def every_help_blocked() -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", BLOCKER_EVERY_HELP, json.dumps(all_command_paths())], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


@pytest.mark.parametrize("path", all_command_paths(), ids=lambda p: " ".join(p))
def test_every_command_help_without_heavy_modules(path, every_help_blocked):
    result = every_help_blocked[" ".join(path)]
    assert result["returncode"] == 0, result["stderr"]
    assert "Usage:" in result["stdout"]


def test_config_commands_without_heavy_modules():
    cfg = str(CONFIGS / "smollm2-cpu.yaml")
    for args in (["config", "validate", cfg], ["config", "show", cfg, "--json"], ["config", "schema"]):
        result = run_blocked(*args)
        assert result.returncode == 0, (args, result.stderr)
    shown = run_blocked("config", "show", cfg, "--json")
    assert json.loads(shown.stdout)["name"] == "smollm2-cpu"


def test_unknown_command_is_usage_error():
    result = run_in_process("frobnicate")
    assert result.returncode == 2
    assert result.stderr.startswith("error: usage:")
    assert "Traceback" not in result.stderr


def test_bad_flag_is_usage_error():
    result = run_in_process("config", "validate", "--no-such-flag", str(CONFIGS / "smollm2-cpu.yaml"))
    assert result.returncode == 2
    assert "no-such-flag" in result.stderr and "Traceback" not in result.stderr


def test_version_json():
    result = run_in_process("version", "--json")
    assert result.returncode == 0
    doc = json.loads(result.stdout)
    assert doc["trtllm-forge"]
    assert "tensorrt_llm" in doc["components"]


def test_module_entry_point_matches_console_script():
    result = subprocess.run([sys.executable, "-m", "trtllm_forge", "--version"], capture_output=True, text=True)
    assert result.returncode == 0 and "trtllm-forge" in result.stdout


def test_commands_named_in_messages_and_readme_exist():
    """Every `trtllm-forge <command> ...` a hint or the README tells users to run is a real command."""
    import re

    from conftest import REPO

    known = set(cli.commands)
    sources = [*REPO.glob("trtllm_forge/**/*.py"), *REPO.glob("builders/**/*.py"), REPO / "README.md"]
    named = {}
    for path in sources:
        for word in re.findall(r"`trtllm-forge ([a-z][a-z-]*)", path.read_text()):
            named.setdefault(word, path.name)
    unknown = {word: where for word, where in named.items() if word not in known}
    assert not unknown, unknown
    assert {"run", "deploy", "render"} <= set(named)


HALF_BUILT_CLIENT = """
import atexit, sys
from trtllm_forge.cli import main

class HalfBuilt:  # like a client whose __init__ a SIGTERM interrupted: its __del__ trips over a missing attribute
    def __init__(self):
        raise RuntimeError("interrupted")

    def __del__(self):
        self.stream.close()

def build_one():  # after main() has run (it ends in sys.exit), as a client half-built during a command would be
    try:
        HalfBuilt()
    except RuntimeError:
        pass

atexit.register(build_one)
main(sys.argv[1:])
"""


@pytest.mark.parametrize("debug", [False, True])
def test_an_exception_in_a_destructor_is_one_line_unless_debug(debug):
    argv = ["--debug", "version"] if debug else ["version"]
    proc = subprocess.run([sys.executable, "-c", HALF_BUILT_CLIENT, *argv], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    if debug:
        assert "Traceback" in proc.stderr and "'HalfBuilt' object has no attribute 'stream'" in proc.stderr
    else:
        assert "Traceback" not in proc.stderr
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("warning: ignored in ") and "AttributeError" in lines[0], proc.stderr
