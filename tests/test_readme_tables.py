"""The README's generated tables equal what scripts/readme_tables.py makes from the committed result files,
and every committed result names the commit and machine it was measured on."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parent.parent


def _readme_tables() -> ModuleType:
    spec = importlib.util.spec_from_file_location("readme_tables_under_test", REPO / "scripts" / "readme_tables.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


tables = _readme_tables()
README = (REPO / "README.md").read_text()
BLOCKS = [m["name"] for m in tables.BLOCK.finditer(README)]


def test_readme_has_generated_blocks() -> None:
    assert BLOCKS, "README.md has no generated block"
    assert len(BLOCKS) == len(set(BLOCKS)), "a block name appears twice in README.md"


@pytest.mark.parametrize("name", BLOCKS)
def test_readme_block_equals_generated(name: str) -> None:
    body = next(m["body"] for m in tables.BLOCK.finditer(README) if m["name"] == name)
    assert body == tables.render(name), f"README block {name} was edited by hand or its result changed: run scripts/readme_tables.py"


def test_hand_edited_number_is_found() -> None:
    match = next(m for m in tables.BLOCK.finditer(README) if any(c.isdigit() for c in m["body"]))
    digit = next(i for i in range(match.start("body"), match.end("body")) if README[i].isdigit())
    edited = README[:digit] + str((int(README[digit]) + 1) % 10) + README[digit + 1 :]
    assert tables.stale_blocks(edited) == [match["name"]]
    assert tables.regenerate(edited) == README


def test_unregistered_block_is_an_error() -> None:
    with pytest.raises(tables.TableError, match="no generator"):
        tables.regenerate(README + "\n<!-- made-up-table:start -->\n| 1 |\n<!-- made-up-table:end -->\n")


@pytest.mark.parametrize("name", BLOCKS)
def test_result_names_commit_and_machine(name: str) -> None:
    source = tables.TABLES[name]
    path = REPO / source.result
    files = sorted(path.glob("*.json")) if path.is_dir() else [path] if path.exists() else []
    if not files:
        assert "No committed result yet" in tables.render(name)
    for file in files:
        document = json.loads(file.read_text())
        commit = document.get("git_commit", "")
        assert len(commit.removesuffix("-dirty")) == 40 and all(c in "0123456789abcdef" for c in commit.removesuffix("-dirty")), file
        machine = document["machine"]
        assert machine.get("cpus") and machine.get("load_average"), file


@pytest.mark.skipif(not (REPO / tables.TABLES["cpu-engine-table"].result).exists(), reason="no committed CPU engine result")
def test_cpu_engine_identity_is_judged_against_the_reference() -> None:
    """Row (a) is the reference and is not judged; every other row is, and counts tokens it produced."""
    document = json.loads((REPO / tables.TABLES["cpu-engine-table"].result).read_text())
    rows = document["rows"]
    assert [r["identical"] for r in rows if r["key"] == "a"] == [None]
    for row in rows:
        if row["key"] != "a":
            assert row["identical"] is not None and 0 <= row["identical"] <= row["total"], row
        assert row["tokens"] > 0 and row["tok_s"] == pytest.approx(row["tokens"] / row["seconds"]), row
