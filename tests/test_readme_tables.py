"""Every number in README.md and docs/**/*.md is backed: generated blocks and facts equal what
scripts/readme_tables.py makes from the committed result files, no cited result was measured on a dirty tree,
every committed result names the commit and machine it was measured on, and no other measured number is typed by
hand."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import ModuleType

import pytest
from conftest import load_script

REPO = Path(__file__).resolve().parent.parent


def _readme_tables() -> ModuleType:
    return load_script("readme_tables.py")


tables = _readme_tables()
DOCS = {path.relative_to(REPO).as_posix(): path.read_text() for path in tables.documents()}
BLOCKS = [(doc, m["name"]) for doc, text in DOCS.items() for m in tables.BLOCK.finditer(text)]
FACTS = [(doc, m["name"]) for doc, text in DOCS.items() for m in tables.FACT.finditer(text)]
CITED = sorted({(name, path) for text in DOCS.values() for name, path in tables.cited_results(text).items()})


def _ids(pairs: list[tuple[str, str]]) -> list[str]:
    return [f"{doc}:{name}" for doc, name in pairs]


def test_documents_have_generated_blocks_once_each() -> None:
    assert BLOCKS, "no document has a generated block"
    names = [name for _, name in BLOCKS]
    assert len(names) == len(set(names)), "a block name appears twice across README.md and docs/"


def test_readme_links_architecture_and_the_docs() -> None:
    readme = DOCS["README.md"]
    assert "(ARCHITECTURE.md)" in readme
    for doc in DOCS:
        if doc.startswith("docs/") and doc.count("/") == 1:
            assert f"({doc})" in readme, f"README.md does not link {doc}"


@pytest.mark.parametrize(("doc", "name"), BLOCKS, ids=_ids(BLOCKS))
def test_block_equals_generated(doc: str, name: str) -> None:
    body = next(m["body"] for m in tables.BLOCK.finditer(DOCS[doc]) if m["name"] == name)
    assert body == tables.render(name), f"{doc}: block {name} was edited by hand or its result changed: run scripts/readme_tables.py"


@pytest.mark.parametrize(("doc", "name"), FACTS, ids=_ids(FACTS))
def test_fact_equals_generated(doc: str, name: str) -> None:
    body = next(m["body"] for m in tables.FACT.finditer(DOCS[doc]) if m["name"] == name)
    assert body == tables.render_fact(name), f"{doc}: fact {name} was edited by hand or its result changed: run scripts/readme_tables.py"


def test_hand_edited_number_is_found() -> None:
    doc, text = next((d, t) for d, t in DOCS.items() if any(any(c.isdigit() for c in m["body"]) for m in tables.BLOCK.finditer(t)))
    match = next(m for m in tables.BLOCK.finditer(text) if any(c.isdigit() for c in m["body"]))
    digit = next(i for i in range(match.start("body"), match.end("body")) if text[i].isdigit())
    edited = text[:digit] + str((int(text[digit]) + 1) % 10) + text[digit + 1 :]
    assert tables.stale_blocks(edited) == [match["name"]], doc
    assert tables.regenerate(edited) == text


def test_hand_edited_fact_is_found() -> None:
    name = next(iter(tables.FACTS))
    sentence = f"It took <!-- fact:{name} -->{tables.render_fact(name)}0<!-- /fact --> repeats.\n"
    assert tables.stale_blocks(sentence) == [name]
    assert tables.regenerate(sentence) == f"It took <!-- fact:{name} -->{tables.render_fact(name)}<!-- /fact --> repeats.\n"


def test_unregistered_block_and_fact_are_errors() -> None:
    with pytest.raises(tables.TableError, match="no generator"):
        tables.regenerate("\n<!-- made-up-table:start -->\n| 1 |\n<!-- made-up-table:end -->\n")
    with pytest.raises(tables.TableError, match="no generator"):
        tables.regenerate("took <!-- fact:made-up -->3 s<!-- /fact -->\n")


@pytest.mark.parametrize("doc", sorted(DOCS))
def test_no_number_outside_generated_text(doc: str) -> None:
    found = tables.prose_numbers(DOCS[doc])
    assert not found, f"{doc}: numbers no result file backs (generate them as a block or fact, or remove them): {found}"


@pytest.mark.parametrize(
    "sentence",
    [
        "a repeated prompt's first token came after 86-100 ms with it",
        "the `tensorrt_llm` model lost 40% against the code before",
        "served 1.90× vs in-process",
        "ITL p99 / TPOT p50 1.41 on the ensemble",
        "int4 weights cost 0.28× the target's step",
        "the first decode step takes 35-45 ms",
        "the chain takes about 1 minute",
        "took `3.4 s` to commit",
        "```\nwarm-up of 16 requests 184 ms\n```",
    ],
)
def test_hand_typed_measurements_are_found(sentence: str) -> None:
    assert tables.prose_numbers(sentence), sentence


@pytest.mark.parametrize(
    "sentence",
    [
        "TensorRT-LLM 1.2.x and Triton 2.51 on Python 3.11, perf_analyzer 2.51.0, TensorRT-LLM 1.2-line sources",
        "issue 16.2 and issue #30, exit 2, exits 3, port 8000, RFC 9113",
        "fp32 on an H100, SmolLM2-135M, HTTP/2, UTF-8, p99, sha256, Qwen2.5-0.5B",
        "NVIDIA's file @ 2a9abd95 read 2026-12-02",
        "`--concurrency 1,8,16` and `runtime.arrival_window_ms: 0` and `tools-switch-interval-0.2ms.json`",
        "1. a numbered step",
        "a [link](docs/benchmarks/batch1-roofline.md)",
    ],
)
def test_names_versions_and_code_are_not_measurements(sentence: str) -> None:
    assert tables.prose_numbers(sentence) == [], sentence


@pytest.mark.parametrize(("name", "path"), CITED, ids=[n for n, _ in CITED])
def test_cited_result_is_from_a_clean_tree(name: str, path: Path) -> None:
    document = json.loads(path.read_text())
    assert not tables.dirty_tree(document), f"{name} cites {path.relative_to(REPO)}, measured on a dirty tree"
    assert document.get("git_dirty", False) is False


def test_dirty_result_is_not_shown(tmp_path: Path) -> None:
    name, source = next((n, s) for n, s in tables.TABLES.items() if s.load_json)
    clean = json.loads((REPO / source.result).read_text())
    for dirty in ({**clean, "git_dirty": True}, {k: v for k, v in clean.items() if k != "git_dirty"} | {"git_commit": "a" * 40 + "-dirty"}):
        result = tmp_path / source.result
        result.parent.mkdir(parents=True, exist_ok=True)
        result.write_text(json.dumps(dirty))
        body = tables.render(name, tmp_path)
        assert "dirty" in body and "Awaiting re-measurement" in body
        assert not any(c.isdigit() for c in body.replace(source.result, "").replace(dirty["git_commit"][:12], "")), body


def test_stale_result_says_it_awaits_remeasurement() -> None:
    stale = [name for name, source in tables.TABLES.items() if source.remeasure]
    for name in stale:
        assert tables.render(name).startswith("_Awaiting re-measurement on today's code"), name
        assert f"`{tables.TABLES[name].remeasure}`" in tables.render(name)


@pytest.mark.parametrize(("doc", "name"), BLOCKS, ids=_ids(BLOCKS))
def test_result_names_commit_and_machine(doc: str, name: str) -> None:
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


@pytest.mark.parametrize("doc", sorted(DOCS))
def test_relative_links_resolve(doc: str) -> None:
    text = tables.CODE_FENCE.sub("", DOCS[doc])
    targets = [t.split("#")[0] for t in re.findall(r"\]\(([^)\s]+)\)", text) if "://" not in t and not t.startswith("#")]
    missing = [t for t in targets if not (REPO / doc).parent.joinpath(t).exists()]
    assert not missing, f"{doc}: links to files that do not exist: {missing}"
