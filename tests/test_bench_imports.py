"""The modules of trtllm_forge.bench import each other without a circle (read with `ast`: every import counts,
inside functions and `if TYPE_CHECKING:` too), and the tool registry the `bench` command's options read stays
light."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from conftest import REPO

PACKAGE = "trtllm_forge.bench"
ROOT = REPO / "trtllm_forge" / "bench"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join([PACKAGE, *(parts[:-1] if parts[-1] == "__init__" else parts)])


def bench_modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(ROOT.rglob("*.py"))}


def imported_names(path: Path, name: str) -> set[str]:
    """Every module name `path` imports (`from a import b` gives a.b as well as a: b may be a module)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            names.add(base)
            names |= {f"{base}.{alias.name}" for alias in node.names}
    return names


def import_graph() -> dict[str, set[str]]:
    modules = bench_modules()
    return {name: {other for other in imported_names(path, name) if other in modules and other != name} for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of `graph` (as a path that returns to its start), or None."""
    state: dict[str, str] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        stack.append(node)
        for other in sorted(graph[node]):
            if state.get(other) == "open":
                return [*stack[stack.index(other) :], other]
            if other not in state and (cycle := visit(other)):
                return cycle
        stack.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_no_import_circle_inside_bench():
    graph = import_graph()
    assert "trtllm_forge.bench.tools.registry" in graph and graph["trtllm_forge.bench.tool_runs"], "the walk found no bench imports"
    cycle = find_cycle(graph)
    assert cycle is None, "import circle: " + " -> ".join(cycle)


def test_the_cycle_finder_finds_a_circle_through_a_function_level_import(tmp_path):
    """The checker itself: run.py -> tool_runs.py at module level, tool_runs.py -> run.py inside a function (as the
    two did before issue #30) is a circle."""
    run = tmp_path / "run.py"
    run.write_text("from trtllm_forge.bench import tool_runs\n")
    tool_runs = tmp_path / "tool_runs.py"
    tool_runs.write_text("def f():\n    from trtllm_forge.bench.run import make_target\n")
    graph = {
        "trtllm_forge.bench.run": imported_names(run, "trtllm_forge.bench.run") & {"trtllm_forge.bench.tool_runs"},
        "trtllm_forge.bench.tool_runs": imported_names(tool_runs, "trtllm_forge.bench.tool_runs") & {"trtllm_forge.bench.run"},
    }
    assert find_cycle(graph) == ["trtllm_forge.bench.run", "trtllm_forge.bench.tool_runs", "trtllm_forge.bench.run"]


def test_the_tool_registry_loads_no_numpy_for_the_command_line():
    """`bench --tool/--emit` take their choices from the registry when the CLI is built: `--help` must stay light."""
    code = (
        "import sys, trtllm_forge.cli, trtllm_forge.bench.tools.registry; print([m for m in ('numpy', 'tritonclient') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
