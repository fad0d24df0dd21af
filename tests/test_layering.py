"""The package's import graph has floors, and an import never climbs to a higher floor or closes a circle.

Every module of the installed package (trtllm_forge plus the folders pyproject's package-dir installs under it:
builders/, plugins/, model_repo_templates/) is parsed with `ast`; every import counts, at any depth (a lazy import
inside a function is still a dependency), and so does `importlib.import_module("trtllm_forge....")` with a literal
name. An import under `if TYPE_CHECKING:` counts for the floors but never runs, so it closes no circle.

The floors, lowest first, are FLOORS below; a module sits on the floor of the longest name in FLOORS that is it or
one of its packages. A module may import from its own floor and those below. The package never imports from tests/
or scripts/ (they are not installed).
"""

from __future__ import annotations

import ast
import fnmatch
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGE = "trtllm_forge"

# Lowest first. Names are relative to trtllm_forge ("" is the package itself).
FLOORS: list[tuple[str, tuple[str, ...]]] = [
    # Utilities every stage uses, and the code served inside Triton's python stub (stdlib, numpy and the engines'
    # own libraries; render copies it into repositories).
    (
        "foundation",
        (
            "",
            "errors",
            "ui",
            "locks",
            "processes",
            "package_versions",
            "user_cache",
            "sample_prompts",
            "stages",
            "stage_results",
            "engine_config",
            "hardware",
            "llmapi_args",
            "plugins",
            "model_repo_templates",
            # Each engine's descriptor and their registry: stdlib-only facts the config and every stage read
            # (tests/test_engine_registry.py keeps them free of other imports).
            "builders.descriptor",
            "builders.engines",
            "builders.*.engine",
        ),
    ),
    # CPU stand-in of TensorRT-LLM's LLM API (runs in the served model) and the shim that makes it `tensorrt_llm`.
    ("served runtime", ("llmapi_cpu", "model_repo_templates.llmapi_cpu_shim")),
    # The configuration and what it is made of: the bench option table (config's bench.workloads[] is derived from
    # it) and the model facts the cross-field rules read.
    (
        "config",
        ("config", "bench.options", "bench.specs", "model_shape", "dtypes", "entrypoint"),
    ),
    # The stages before serving, and what they know about the server they build for.
    ("import, build, plan", ("importer", "builders", "plan", "deploy.discovery", "deploy.server_argv")),
    ("render", ("render",)),
    ("deploy", ("deploy", "containers")),
    # Talking to a deployment.
    ("verify, bench", ("verify", "bench", "client", "llmapi_requests")),
    ("pipeline", ("pipeline", "doctor", "tune")),
    ("commands", ("commands", "cli", "__main__")),
]


@dataclass(frozen=True)
class Import:
    importer: str  # module names relative to trtllm_forge ("" for the package itself)
    imported: str
    line: int
    type_only: bool = False  # under `if TYPE_CHECKING:`: a floor's dependency, but never run (no circle)

    def where(self) -> str:
        how = " (type checking only)" if self.type_only else ""
        return f"{module_file(self.importer).relative_to(REPO)}:{self.line} imports {qualified(self.imported)}{how}"


def qualified(name: str) -> str:
    return f"{PACKAGE}.{name}" if name else PACKAGE


def relative(name: str) -> str:
    return "" if name == PACKAGE else name.removeprefix(PACKAGE + ".")


@cache
def package_folders() -> dict[str, Path]:
    """{"": trtllm_forge/, "builders": builders/, ...} from pyproject's package-dir (defined once there)."""
    package_dir = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    return {relative(name): REPO / folder for name, folder in package_dir.items()}


@cache
def modules() -> dict[str, Path]:
    """Every module of the installed package by its name relative to trtllm_forge."""
    found: dict[str, Path] = {}
    for prefix, folder in package_folders().items():
        for path in sorted(folder.rglob("*.py")):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if "__pycache__" in parts:
                continue
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(p for p in (prefix, *parts) if p)] = path
    return found


def module_file(name: str) -> Path:
    return modules()[name]


def is_package(name: str) -> bool:
    return module_file(name).name == "__init__.py"


def _longest_module(dotted: str) -> str | None:
    """The module a dotted name (relative to trtllm_forge) is or lives in: "config.schema.ForgeConfig" -> "config.schema"."""
    while True:
        if dotted in modules():
            return dotted
        if not dotted:
            return None
        dotted = dotted.rpartition(".")[0]


def _named(node: ast.Import | ast.ImportFrom, importer: str) -> Iterator[str]:
    """The absolute dotted names one import statement reaches: each `from P import N` reaches P.N (a module or a
    name in P)."""
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
        return
    base = node.module or ""
    if node.level:
        package = qualified(importer).split(".")
        if not is_package(importer):
            package.pop()
        package = package[: len(package) - (node.level - 1)]
        base = ".".join([*package, *([node.module] if node.module else [])])
    for alias in node.names:
        yield f"{base}.{alias.name}" if alias.name != "*" else base


def _type_checking_lines(tree: ast.AST) -> set[int]:
    """Lines of the imports under `if TYPE_CHECKING:` (or `typing.TYPE_CHECKING`)."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        test = node.test if isinstance(node, ast.If) else None
        name = test.id if isinstance(test, ast.Name) else test.attr if isinstance(test, ast.Attribute) else None
        if isinstance(node, ast.If) and name == "TYPE_CHECKING":
            lines |= {child.lineno for body in node.body for child in ast.walk(body) if isinstance(child, ast.Import | ast.ImportFrom)}
    return lines


def imported_names(module: str, tree: ast.AST) -> Iterator[tuple[str, int, bool]]:
    """(absolute dotted name, line, type checking only) of every import in a module, lazy ones and
    importlib.import_module("...") included."""
    type_only = _type_checking_lines(tree)
    for child in ast.walk(tree):
        if isinstance(child, ast.Import | ast.ImportFrom):
            yield from ((name, child.lineno, child.lineno in type_only) for name in _named(child, module))
        elif (
            isinstance(child, ast.Call)
            and isinstance(child.func, ast.Attribute | ast.Name)
            and (child.func.attr if isinstance(child.func, ast.Attribute) else child.func.id) == "import_module"
            and child.args
            and isinstance(child.args[0], ast.Constant)
            and isinstance(child.args[0].value, str)
        ):
            yield child.args[0].value, child.lineno, False


@cache
def parsed_imports() -> dict[str, list[tuple[str, int, bool]]]:
    """Every module's imports as absolute dotted names with their line."""
    return {name: list(imported_names(name, ast.parse(path.read_text(), str(path)))) for name, path in modules().items()}


@cache
def imports() -> list[Import]:
    """The imports of our own modules, by the module each reaches."""
    edges: set[Import] = set()
    for importer, names in parsed_imports().items():
        for dotted, line, type_only in names:
            if dotted != PACKAGE and not dotted.startswith(PACKAGE + "."):
                continue
            target = _longest_module(relative(dotted))
            if target is not None and target != importer:
                edges.add(Import(importer, target, line, type_only))
    return sorted(edges, key=lambda e: (e.importer, e.imported, e.line))


def floor_of(name: str) -> int:
    """The index in FLOORS of the longest floor entry that is `name` or one of its packages."""
    best: tuple[int, int] | None = None  # (length of the matching entry, floor)
    for index, (_, entries) in enumerate(FLOORS):
        for entry in entries:
            matches = entry == "" or fnmatch.fnmatchcase(name, entry) or fnmatch.fnmatchcase(name, entry + ".*")
            if matches and (best is None or len(entry) > best[0]):
                best = (len(entry), index)
    assert best is not None, f"{qualified(name)} is on no floor: add it (or its package) to FLOORS in {__file__}"
    return best[1]


def climbing() -> list[Import]:
    return [e for e in imports() if floor_of(e.imported) > floor_of(e.importer)]


def cycles() -> list[list[str]]:
    """Import circles: the strongly connected components of more than one module (Tarjan), each sorted."""
    graph: dict[str, set[str]] = {name: set() for name in modules()}
    for edge in imports():
        if not edge.type_only:
            graph[edge.importer].add(edge.imported)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for successor in sorted(graph[node]):
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def edges_in(component: list[str]) -> list[Import]:
    members = set(component)
    return [e for e in imports() if e.importer in members and e.imported in members and not e.type_only]


def test_the_package_is_parsed_with_its_installed_subpackages():
    names = modules()
    for expected in ("cli", "config.schema", "builders.registry", "model_repo_templates.python_models.request_checks"):
        assert expected in names, f"{qualified(expected)} not found: the walk of pyproject's package-dir misses it"
    edges = {(e.importer, e.imported) for e in imports()}
    assert ("bench.workload", "model_repo_templates.python_models.tokenizer_loading") in edges, "a lazy import is not seen"
    assert ("bench.options", "bench.specs") in edges


def test_every_module_is_on_a_floor():
    for name in modules():
        floor_of(name)  # asserts with the module's name


def test_no_import_climbs_to_a_higher_floor():
    unexpected = climbing()
    assert not unexpected, "imports that climb to a higher floor (FLOORS in tests/test_layering.py):\n" + "\n".join(
        f"  {e.where()}: {FLOORS[floor_of(e.importer)][0]} -> {FLOORS[floor_of(e.imported)][0]}" for e in unexpected
    )


def test_no_import_circles():
    problems = [
        ", ".join(qualified(m) for m in component) + ":\n" + "\n".join(f"    {e.where()}" for e in edges_in(component))
        for component in cycles()
    ]
    assert not problems, "import circles:\n  " + "\n  ".join(problems)


def outside_modules() -> dict[str, Path]:
    """The top-level names tests/ and scripts/ define (their modules and packages), which an installed package
    cannot import."""
    names: dict[str, Path] = {"tests": REPO / "tests", "scripts": REPO / "scripts"}
    for folder in (REPO / "tests", REPO / "scripts"):
        for path in folder.iterdir():
            if path.suffix == ".py" or (path.is_dir() and (path / "__init__.py").is_file()):
                names[path.stem] = path
    return names


def test_the_package_imports_nothing_from_tests_or_scripts():
    outside = outside_modules()
    assert "conftest" in outside and "typecheck" in outside  # the walk sees both folders
    found = [
        f"{modules()[importer].relative_to(REPO)}:{line} imports {dotted} ({outside[dotted.split('.')[0]].relative_to(REPO)})"
        for importer, names in parsed_imports().items()
        for dotted, line, _ in names
        if dotted.split(".")[0] in outside
    ]
    assert not found, "the installed package imports from tests/ or scripts/:\n  " + "\n  ".join(found)
