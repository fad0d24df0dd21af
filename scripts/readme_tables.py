#!/usr/bin/env python3
"""Regenerate every generated table of README.md from the committed result files.

A generated block sits between `<!-- NAME:start -->` and `<!-- NAME:end -->`; NAME is registered in TABLES below
with the benchmark script that owns the table, the function that renders it and the committed result it reads
(a JSON file, or a results folder for scripts that pick their newest file); a block whose result is not committed
says so instead of showing numbers. Nobody edits those numbers by hand:
`tests/test_readme_tables.py` fails when the README differs from what this script generates.

    .venv/bin/python scripts/readme_tables.py            # rewrite README.md in place
    .venv/bin/python scripts/readme_tables.py --check    # exit 1 and name the stale blocks; change nothing
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


@dataclass(frozen=True)
class TableSource:
    """One generated README block: `script`'s `function` renders it from `result` (relative to the repository).
    With `load_json` the function gets the parsed document, otherwise the path itself."""

    script: str
    function: str
    result: str
    load_json: bool = True


TABLES: dict[str, TableSource] = {
    "cpu-engine-table": TableSource("bench_cpu_engine.py", "render_table", "results/bench_cpu_engine/cpu_engine.json"),
    "cpu-engine-concurrency-table": TableSource(
        "bench_cpu_engine.py", "render_concurrency_table", "results/bench_cpu_engine/concurrency.json"
    ),
    "batch1-roofline": TableSource("bench_batch1_roofline.py", "render_report", "results/bench_batch1_roofline/batch1.json"),
    "batch1-profile": TableSource("bench_batch1_profile.py", "render_profile", "results/bench_batch1_roofline/profile.json"),
    "llamacpp-peer-table": TableSource("bench_llamacpp_peer.py", "render_table", "results/bench_llamacpp_peer/peer.json"),
    "bench-fidelity-timing": TableSource("bench_fidelity.py", "render_tables", "results/bench_fidelity/timing.json"),
    "bench-fidelity-table": TableSource("bench_tools_fidelity.py", "readme_table", "results/bench_fidelity/tools.json"),
    "cpu-streaming-table": TableSource("bench_cpu_streaming.py", "render_table", "results/bench_cpu_streaming/streaming.json"),
    "cpu-arrival-window-table": TableSource("bench_cpu_streaming.py", "render_table", "results/bench_cpu_streaming/arrival_window.json"),
    "cpu-kv-pool-table": TableSource("bench_cpu_streaming.py", "render_table", "results/bench_cpu_streaming/kv_pool_commit.json"),
    "cpu-speculative-table": TableSource("bench_cpu_speculative.py", "render_table", "results/bench_cpu_speculative/batch1.json"),
    # helper h5's LLM API table: its renderer picks the newest file of the folder
    "llmapi-cpu-table": TableSource("bench_llmapi_cpu.py", "render_llmapi_table", "results/llmapi_cpu", load_json=False),
}


class TableError(Exception):
    """A README block that cannot be generated (unregistered name, missing script, function or result)."""


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


def render(name: str, repo: Path = REPO) -> str:
    """The body of block `name`, generated from the committed result."""
    source = TABLES.get(name)
    if source is None:
        raise TableError(f"README block {name!r} has no generator; registered: {', '.join(sorted(TABLES))}")
    function: Callable[[Any], str] | None = getattr(_script(source.script), source.function, None)
    if function is None:
        raise TableError(f"scripts/{source.script} has no function {source.function}()")
    result = repo / source.result
    if not result.exists():
        return f"_No committed result yet: run `scripts/{source.script}`, commit `{source.result}`, then `scripts/readme_tables.py`._\n"
    text = function(json.loads(result.read_text()) if source.load_json else result)
    return text if text.endswith("\n") else text + "\n"


def regenerate(readme_text: str, repo: Path = REPO, only: set[str] | None = None) -> str:
    """The README text with every generated block (or those named in `only`) replaced by what its generator
    makes now."""

    def replace(match: re.Match[str]) -> str:
        name = match["name"]
        if only is not None and name not in only:
            return match[0]
        return f"<!-- {name}:start -->\n{render(name, repo)}<!-- {name}:end -->"

    return BLOCK.sub(replace, readme_text)


def stale_blocks(readme_text: str, repo: Path = REPO) -> list[str]:
    """Names of the blocks whose README text differs from what would be generated."""
    return [m["name"] for m in BLOCK.finditer(readme_text) if m["body"] != render(m["name"], repo)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report stale blocks (exit 1 when there are some)")
    parser.add_argument("--readme", type=Path, default=README)
    parser.add_argument("--only", help="comma-separated block names to regenerate (default: all)")
    args = parser.parse_args(argv)
    text = args.readme.read_text()
    try:
        if args.check:
            stale = stale_blocks(text)
            for name in stale:
                print(f"{args.readme}: block {name} differs from its committed result; run scripts/readme_tables.py", file=sys.stderr)
            return 1 if stale else 0
        new = regenerate(text, only={n.strip() for n in args.only.split(",")} if args.only else None)
    except TableError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if new != text:
        tmp = args.readme.with_name(args.readme.name + ".tmp")
        tmp.write_text(new)
        tmp.replace(args.readme)
    names = [m["name"] for m in BLOCK.finditer(new)]
    print(f"{args.readme}: {len(names)} generated blocks ({', '.join(names)})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
