#!/usr/bin/env python3
"""Regenerate every generated block and fact of README.md and docs/**/*.md from the committed result files.

Two kinds of generated text, both in the Markdown source as HTML comments (invisible once rendered):

- a block, between `<!-- NAME:start -->` and `<!-- NAME:end -->` on lines of their own: NAME is registered in
  TABLES with the benchmark script that owns it, the function that renders it and the committed result it reads
  (a JSON file, or a results folder whose newest file the script reads);
- a fact, inline in a sentence: `<!-- fact:NAME -->1.39×<!-- /fact -->`: NAME is registered in FACTS with the
  result file, the field it reads (`rows[key=d].tok_s`) and how to print it.

A result measured on a tree that differed from its commit (`git_dirty: true`, or a commit ending in `-dirty`) is
never shown: its block says so instead. A block whose result predates changes to the code it measures says it is
awaiting re-measurement, with the command that re-measures it. Every other number in these documents must be one
that is not measured (a version, an issue number, a flag value; `NOT_MEASURED` below): `prose_numbers` finds the
rest, and `tests/test_readme_tables.py` fails on them, on a stale block or fact and on a dirty result.

    .venv/bin/python scripts/readme_tables.py            # rewrite README.md and docs/**/*.md in place
    .venv/bin/python scripts/readme_tables.py --check    # exit 1 and name stale blocks and unbacked numbers
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
RESULTS = REPO / "results"
SCRIPTS = REPO / "scripts"
BLOCK = re.compile(r"<!-- (?P<name>[a-z0-9-]+):start -->\n(?P<body>.*?)<!-- (?P=name):end -->", re.DOTALL)
FACT = re.compile(r"<!-- fact:(?P<name>[a-z0-9-]+) -->(?P<body>[^\n]*?)<!-- /fact -->")


def documents(repo: Path = REPO) -> list[Path]:
    """The documents whose numbers are generated or checked: the README and every Markdown file under docs/."""
    return [repo / "README.md", *sorted((repo / "docs").rglob("*.md"))]


@dataclass(frozen=True)
class TableSource:
    """One generated block: `script`'s `function` renders it from `result` (relative to the repository). With
    `load_json` the function gets the parsed document, otherwise the path itself (a folder: the script reads its
    newest file). `remeasure` is set when the code the result measures has changed since its commit: the command
    that measures it again, which the block shows above the old numbers."""

    script: str
    function: str
    result: str
    load_json: bool = True
    remeasure: str = ""


TABLES: dict[str, TableSource] = {
    "cpu-engine-table": TableSource(
        "bench_cpu_engine.py",
        "render_table",
        "results/bench_cpu_engine/cpu_engine.json",
    ),
    "cpu-engine-concurrency-table": TableSource(
        "bench_cpu_engine.py", "render_concurrency_table", "results/bench_cpu_engine/concurrency.json"
    ),
    "batch1-roofline": TableSource(
        "bench_batch1_roofline.py",
        "render_report",
        "results/bench_batch1_roofline/batch1.json",
    ),
    "batch1-profile": TableSource("bench_batch1_profile.py", "render_profile", "results/bench_batch1_roofline/profile.json"),
    "llamacpp-peer-table": TableSource("bench_llamacpp_peer.py", "render_table", "results/bench_llamacpp_peer/peer.json"),
    "bench-fidelity-timing": TableSource(
        "bench_fidelity.py",
        "render_tables",
        "results/bench_fidelity/timing.json",
    ),
    "bench-fidelity-table": TableSource("bench_tools_fidelity.py", "readme_table", "results/bench_fidelity/tools.json"),
    "cpu-streaming-table": TableSource(
        "bench_cpu_streaming.py",
        "render_table",
        "results/bench_cpu_streaming/streaming.json",
    ),
    "cpu-arrival-window-table": TableSource("bench_cpu_streaming.py", "render_table", "results/bench_cpu_streaming/arrival_window.json"),
    "cpu-kv-pool-table": TableSource("bench_cpu_streaming.py", "render_table", "results/bench_cpu_streaming/kv_pool_commit.json"),
    "cpu-speculative-table": TableSource(
        "bench_cpu_speculative.py",
        "render_table",
        "results/bench_cpu_speculative/batch1.json",
    ),
    "dynamo-routing-table": TableSource("bench_dynamo.py", "render_routing_table", "results/bench_dynamo/dynamo.json"),
    "dynamo-throughput-table": TableSource("bench_dynamo.py", "render_throughput_table", "results/bench_dynamo/dynamo.json"),
    "tune-table": TableSource("bench_tune.py", "render_table", "results/bench_tune/tune.json"),
    "llmapi-cpu-table": TableSource(
        "bench_llmapi_cpu.py",
        "render_llmapi_table",
        "results/llmapi_cpu",
        load_json=False,
    ),
}


@dataclass(frozen=True)
class FactSource:
    """One generated number in a sentence: the field at `field` of `result`, printed with `template` (a format
    string whose `{}` gets the value). `field` is a dotted path; `name[key=value]` picks the list item whose `key`
    equals `value`, `name[N]` the Nth item."""

    result: str
    field: str
    template: str = "{}"


FACTS: dict[str, FactSource] = {
    "fidelity-repeats": FactSource("results/bench_fidelity/tools.json", "repeats"),
}


class TableError(Exception):
    """A block or fact that cannot be generated (unregistered name, missing script, function, result or field)."""


def _script(name: str) -> ModuleType:
    path = SCRIPTS / name
    if not path.is_file():
        raise TableError(f"scripts/{name} does not exist")
    module_name = f"_readme_tables_{path.stem}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise TableError(f"scripts/{name} cannot be imported")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


def cited_file(result: Path) -> Path | None:
    """The file a block reads: the result itself, or a folder's newest `*.json` by name (the scripts that keep a
    folder name their files by UTC time); None when nothing is committed."""
    if result.is_dir():
        files = sorted(result.glob("*.json"))
        return files[-1] if files else None
    return result if result.exists() else None


def dirty_tree(document: dict[str, Any]) -> bool:
    """Whether the result was measured on a tree that differed from its commit: `git_dirty`, or for scripts that
    record no such field, the `-dirty` suffix of `git_commit`; a result naming no commit counts as dirty."""
    commit = str(document.get("git_commit", ""))
    if "git_dirty" in document:
        return bool(document["git_dirty"]) or commit.endswith("-dirty")
    return not commit or commit == "unknown" or commit.endswith("-dirty")


def _commit(document: dict[str, Any]) -> str:
    return str(document.get("git_commit", "unknown")).removesuffix("-dirty")[:12]


def render(name: str, repo: Path = REPO) -> str:
    """The body of block `name`, generated from the committed result."""
    source = TABLES.get(name)
    if source is None:
        raise TableError(f"block {name!r} has no generator; registered: {', '.join(sorted(TABLES))}")
    function: Callable[[Any], str] | None = getattr(_script(source.script), source.function, None)
    if function is None:
        raise TableError(f"scripts/{source.script} has no function {source.function}()")
    result = repo / source.result
    cited = cited_file(result)
    if cited is None:
        return f"_No committed result yet: run `scripts/{source.script}`, commit `{source.result}`, then `scripts/readme_tables.py`._\n"
    document = json.loads(cited.read_text())
    if dirty_tree(document):
        return (
            f"_Not shown: `{cited.relative_to(repo)}` was measured on a dirty tree (files differed from its commit "
            f"{_commit(document)}). Awaiting re-measurement: run `scripts/{source.script}` on a clean tree, commit the "
            "result, then `scripts/readme_tables.py`._\n"
        )
    text = function(document if source.load_json else result)
    text = text if text.endswith("\n") else text + "\n"
    if source.remeasure:
        text = (
            f"_Awaiting re-measurement on today's code: these numbers were measured at git {_commit(document)}, and the "
            f"code they measure has changed since. Re-measure with `{source.remeasure}`, then `scripts/readme_tables.py`._\n\n" + text
        )
    return text


_STEP = re.compile(r"(?P<name>[^.\[\]]+)(?:\[(?P<select>[^\]]+)\])?")


def lookup(document: Any, field: str) -> Any:
    """The value at `field` (see FactSource) in a parsed result; TableError naming the step that is missing."""
    value = document
    for step in field.split("."):
        match = _STEP.fullmatch(step)
        if match is None or not isinstance(value, dict) or match["name"] not in value:
            raise TableError(f"no field {step!r} in {field!r}")
        value = value[match["name"]]
        select = match["select"]
        if select is None:
            continue
        if not isinstance(value, list):
            raise TableError(f"{match['name']!r} in {field!r} is not a list")
        if select.isdigit():
            if int(select) >= len(value):
                raise TableError(f"{step!r} in {field!r}: the list has {len(value)} items")
            value = value[int(select)]
            continue
        key, _, wanted = select.partition("=")
        found = [item for item in value if isinstance(item, dict) and str(item.get(key)) == wanted]
        if len(found) != 1:
            raise TableError(f"{step!r} in {field!r} matches {len(found)} items, not one")
        value = found[0]
    return value


def render_fact(name: str, repo: Path = REPO) -> str:
    """The text of fact `name`, generated from the committed result."""
    source = FACTS.get(name)
    if source is None:
        raise TableError(f"fact {name!r} has no generator; registered: {', '.join(sorted(FACTS))}")
    path = repo / source.result
    if not path.is_file():
        raise TableError(f"fact {name!r}: {source.result} is not committed")
    document = json.loads(path.read_text())
    if dirty_tree(document):
        raise TableError(f"fact {name!r}: {source.result} was measured on a dirty tree; it cannot be cited")
    return source.template.format(lookup(document, source.field))


def regenerate(text: str, repo: Path = REPO, only: set[str] | None = None) -> str:
    """The document text with every generated block and fact (or those named in `only`) replaced by what its
    generator makes now."""

    def block(match: re.Match[str]) -> str:
        name = match["name"]
        if only is not None and name not in only:
            return match[0]
        return f"<!-- {name}:start -->\n{render(name, repo)}<!-- {name}:end -->"

    def fact(match: re.Match[str]) -> str:
        name = match["name"]
        if only is not None and name not in only:
            return match[0]
        return f"<!-- fact:{name} -->{render_fact(name, repo)}<!-- /fact -->"

    return FACT.sub(fact, BLOCK.sub(block, text))


def stale_blocks(text: str, repo: Path = REPO) -> list[str]:
    """Names of the blocks and facts whose text differs from what would be generated."""
    blocks = [m["name"] for m in BLOCK.finditer(text) if m["body"] != render(m["name"], repo)]
    return blocks + [m["name"] for m in FACT.finditer(text) if m["body"] != render_fact(m["name"], repo)]


def cited_results(text: str, repo: Path = REPO) -> dict[str, Path]:
    """Block and fact name → the result file it shows numbers from (blocks without a committed result left out)."""
    cited: dict[str, Path] = {}
    for match in BLOCK.finditer(text):
        source = TABLES.get(match["name"])
        found = cited_file(repo / source.result) if source else None
        if found is not None:
            cited[match["name"]] = found
    for match in FACT.finditer(text):
        fact = FACTS.get(match["name"])
        if fact is not None:
            cited[f"fact:{match['name']}"] = repo / fact.result
    return cited


# ---- numbers outside generated text ----

# Numbers that are not measurements, by where they stand. Each pattern is matched against a digit-bearing word
# (with the words before it); anything else with a digit is a measured number typed by hand.
CODE_FENCE = re.compile(r"^```.*?^```", re.DOTALL | re.MULTILINE)
CODE_SPAN = re.compile(r"`(?:[^`\n]|\n(?!\s*\n))+`")  # may wrap a line, never a paragraph
# A measured quantity inside code is still a measurement: a number with a unit of time, rate, size or a ratio.
MEASURED_IN_CODE = re.compile(r"(?<![\w.-])\d+(?:\.\d+)?\s*(?:ms|µs|us|s|min|GB/s|MB|GB|MiB|GiB|tok/s|%|×)(?![\w/-]|\.\w)")
LINK_TARGET = re.compile(r"\]\([^)]*\)")
COMMENT = re.compile(r"<!--.*?-->", re.DOTALL)
LIST_MARKER = re.compile(r"^(\s*)\d+\.(?=\s)", re.MULTILINE)
WORD = re.compile(r"[^\s|()\[\]{},;:\"'*`<>]*\d[^\s|()\[\]{},;:\"'*`<>]*")
NOT_MEASURED: dict[str, re.Pattern[str]] = {
    # a name that carries digits: fp32, int4_awq, H100, SmolLM2-135M, HTTP/2, UTF-8, p99, sha256
    "identifier": re.compile(r"[A-Za-z_][\w.+/=<>-]*"),
    # versions: three or more parts (1.2.1, 0.13.0), a series (1.2.x, 1.x, 1.2-line), a minimum (3.11+)
    "version": re.compile(r"v?\d+(?:\.\d+){2,}[\w.+-]*|\d+(?:\.\d+)*\.x|\d+(?:\.\d+)+(?:-line|\+)"),
    # a git commit, abbreviated or full
    "commit": re.compile(r"@?(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}"),
    # a date or a UTC time stamp
    "date": re.compile(r"\d{4}-\d{2}-\d{2}(?:T[\d:]+Z?)?"),
    # an issue or pull request: #30, #30.4
    "issue": re.compile(r"[\w/-]*#\d+(?:\.\d+)?"),
}
# Words after which a bare number is a name, not a measurement: an issue or item, an exit code, a port, a
# standard, or the version of a product.
NAMED_BY_PREVIOUS_WORD = re.compile(
    r"(?:issues?|items?|PR|exits?|exit code|codes?|ports?|RFC|HTTP|Linux|Python|python|TensorRT-LLM|TensorRT|Triton|tritonserver|"
    r"CUDA|perf_analyzer|GenAI-Perf|AIPerf|genai-perf|aiperf|tritonclient|torch|numpy|OpenVINO|transformers|"
    r"nvidia-pytriton|capability|SM|NGC)$",
    re.IGNORECASE,
)


def _blank(match: re.Match[str]) -> str:
    """The match replaced by spaces, newlines kept (so line numbers stay right)."""
    return re.sub(r"[^\n]", " ", match[0])


def prose_numbers(text: str) -> list[tuple[int, str]]:
    """(line, word) of every digit-bearing word outside generated blocks, facts and link targets that is not a
    NOT_MEASURED kind; also every measured quantity (a number with a unit) inside code."""
    text = BLOCK.sub(_blank, text)
    text = FACT.sub(_blank, text)
    text = COMMENT.sub(_blank, text)
    found: list[tuple[int, str]] = []

    def code(match: re.Match[str]) -> str:
        for quantity in MEASURED_IN_CODE.finditer(match[0]):
            line = text.count("\n", 0, match.start() + quantity.start()) + 1
            found.append((line, match[0][max(0, quantity.start() - 8) : quantity.end()].strip()))
        return _blank(match)

    text = CODE_FENCE.sub(code, text)
    text = CODE_SPAN.sub(code, text)
    text = LINK_TARGET.sub(_blank, text)
    text = LIST_MARKER.sub(lambda m: m[1] + "  ", text)
    previous_words = re.compile(r"([\w.+-]+(?: [\w.+-]+)?)\s+$")
    for match in WORD.finditer(text):
        word = match[0].strip(".!?-–—")
        if not any(c.isdigit() for c in word) or any(p.fullmatch(word) for p in NOT_MEASURED.values()):
            continue
        before = previous_words.search(text, max(0, match.start() - 40), match.start())
        if before and re.fullmatch(r"\d+(?:\.\d+)*", word) and NAMED_BY_PREVIOUS_WORD.search(before[1]):
            continue
        found.append((text.count("\n", 0, match.start()) + 1, word))
    return sorted(found)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report stale blocks and unbacked numbers (exit 1 when there are some)")
    parser.add_argument("--doc", type=Path, action="append", help="a document to process (repeatable; default: README.md and docs/**/*.md)")
    parser.add_argument("--only", help="comma-separated block or fact names to regenerate (default: all)")
    args = parser.parse_args(argv)
    paths: list[Path] = args.doc or documents()
    only = {n.strip() for n in args.only.split(",")} if args.only else None
    failed = False
    try:
        for path in paths:
            text = path.read_text()
            if args.check:
                for name in stale_blocks(text):
                    print(f"{path}: {name} differs from its committed result; run scripts/readme_tables.py", file=sys.stderr)
                    failed = True
                for line, word in prose_numbers(text):
                    print(f"{path}:{line}: {word!r} is a number no result file backs; generate it or remove it", file=sys.stderr)
                    failed = True
                continue
            new = regenerate(text, only=only)
            if new != text:
                tmp = path.with_name(path.name + ".tmp")
                tmp.write_text(new)
                tmp.replace(path)
            names = [m["name"] for m in BLOCK.finditer(new)] + [f"fact:{m['name']}" for m in FACT.finditer(new)]
            if names:
                print(f"{path}: {len(names)} generated ({', '.join(names)})", file=sys.stderr)
    except TableError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
