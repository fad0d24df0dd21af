"""Read a config file's YAML with bounded time and memory, and remember the line of every field.

PyYAML's safe loader trusts its input's shape: aliases are shared nodes that pydantic expands
(a 443-byte alias bomb took 63 s and 1.9 GB), nesting recurses once per level (50,000 levels end in
RecursionError), a duplicate key silently replaces the first and `12:` becomes an integer key.
Here the composed node graph is walked once before anything is built from it: its expanded size,
depth and integers are bounded, every key is a name (kept as written) and is unique in its mapping.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from trtllm_forge.errors import ConfigError

MAX_FILE_BYTES = 1 << 20  # a config is a few kB; this bounds parse time and memory
MAX_DEPTH = 32  # the deepest field of the schema is 5 levels down
MAX_NODES = 100_000  # values after expanding aliases
MAX_INT_DIGITS = 18  # every integer field fits easily; int() of 4,301 digits raises ValueError
MERGE_TAG = "tag:yaml.org,2002:merge"
INT_TAG = "tag:yaml.org,2002:int"


@dataclass
class YamlDocument:
    data: dict
    lines: dict[str, int]  # dotted field path ("engine.max_batch_size", "bench.workloads[0]") -> 1-based line

    def line_of(self, field: str) -> int | None:
        """The line of `field`, or of its nearest ancestor that the file spells out."""
        while field:
            if field in self.lines:
                return self.lines[field]
            cut = max(field.rfind("."), field.rfind("["))
            field = field[:cut] if cut > 0 else ""
        return None


def shorten(value: object, limit: int = 60) -> str:
    """repr() of a value for an error line, never longer than `limit` characters."""
    text = repr(value) if not isinstance(value, (dict, list)) else _preview(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _preview(value: dict | list) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: …" for k in list(value)[:4]) + (", …}" if len(value) > 4 else "}")
    return f"a list of {len(value)} items"


class _Loader(yaml.SafeLoader):
    """SafeLoader whose composer stops at MAX_DEPTH and whose mapping keys are the text as written."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.depth = 0

    def compose_node(self, parent: Node | None, index: int) -> Node | None:
        self.depth += 1
        try:
            if self.depth > MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise yaml.composer.ComposerError(None, None, f"nested deeper than {MAX_DEPTH} levels", mark)
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Hashable, Any]:
        self.flatten_mapping(node)  # YAML merge keys (<<: *base); later keys win, as in YAML
        return {str(key.value): self.construct_object(value, deep=deep) for key, value in node.value}


class _Walk:
    """One pass over the composed graph: limits, key rules and the line of every field."""

    def __init__(self, where: str):
        self.where = where
        self.lines: dict[str, int] = {}
        self.count = 0
        self.active: set[int] = set()

    def fail(self, node: Node, field: str, problem: str, valid: str) -> None:
        raise ConfigError(field or "(top level)", problem, valid, source=f"{self.where}:{node.start_mark.line + 1}")

    def visit(self, node: Node, field: str, depth: int) -> None:
        self.count += 1
        if self.count > MAX_NODES:
            self.fail(
                node,
                field,
                f"expands to more than {MAX_NODES:,} values (aliases repeating aliases?)",
                "write the values out, or use fewer nested aliases",
            )
        if depth > MAX_DEPTH:
            self.fail(node, field, f"nested deeper than {MAX_DEPTH} levels (through aliases)", "flatten the value")
        if id(node) in self.active:
            self.fail(node, field, "an alias refers to a value that contains it", "remove the recursive alias")
        if isinstance(node, ScalarNode):
            if node.tag == INT_TAG and sum(c.isdigit() for c in node.value) > MAX_INT_DIGITS:
                digits = sum(c.isdigit() for c in node.value)
                self.fail(node, field, f"integer with {digits:,} digits", f"use at most {MAX_INT_DIGITS} digits")
            return
        self.active.add(id(node))
        try:
            if isinstance(node, SequenceNode):
                for index, item in enumerate(node.value):
                    path = f"{field}[{index}]"
                    self.lines.setdefault(path, item.start_mark.line + 1)
                    self.visit(item, path, depth + 1)
            elif isinstance(node, MappingNode):
                self.visit_mapping(node, field, depth)
        finally:
            self.active.discard(id(node))

    def visit_mapping(self, node: MappingNode, field: str, depth: int) -> None:
        seen: dict[str, int] = {}
        for key, value in node.value:
            if key.tag == MERGE_TAG:
                merged = value.value if isinstance(value, SequenceNode) else [value]
                for item in merged:
                    if not isinstance(item, MappingNode):
                        self.fail(item, field, "a merge key (<<) takes a mapping or a list of mappings", "merge a mapping")
                    self.visit_mapping(item, field, depth + 1)
                continue
            if not isinstance(key, ScalarNode):
                self.fail(key, field, "a key is a list or a mapping", "keys are names such as max_batch_size")
            name = key.value
            path = f"{field}.{name}" if field else name
            line = key.start_mark.line + 1
            if name in seen:
                self.fail(key, path, f"duplicate key {shorten(name)} (first at line {seen[name]})", "keep only one of them")
            seen[name] = line
            self.lines[path] = line
            self.visit(value, path, depth + 1)


def _decode(raw: bytes, where: str) -> str:
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise ConfigError(
            "(file)",
            f"is not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start})",
            "save the file as UTF-8",
            source=f"{where}:{line}",
        ) from None


def _yaml_problem(exc: yaml.YAMLError, where: str) -> ConfigError:
    mark = getattr(exc, "problem_mark", None)
    source = f"{where}:{mark.line + 1}" if mark else where
    problem = getattr(exc, "problem", None) or (str(exc).splitlines() or ["unreadable"])[0]
    if problem.startswith("nested deeper"):
        return ConfigError("(nesting)", problem, "a config's values are at most a few levels deep", source=source)
    return ConfigError("", f"invalid YAML ({problem[:120]})", "fix the syntax at that line", source=source)


def read_yaml_document(path: Path) -> YamlDocument:
    """The mapping in the YAML file at `path` with the line of each field; ConfigError naming the file otherwise."""
    where = str(path)
    if not path.is_file():
        raise ConfigError("", "config file not found", "pass the path of an existing YAML file", source=where)
    size = path.stat().st_size
    if size > MAX_FILE_BYTES:
        raise ConfigError("(file)", f"is {size:,} bytes", f"a config is at most {MAX_FILE_BYTES:,} bytes", source=where)
    text = _decode(path.read_bytes(), where)
    try:  # the reader checks the whole text for characters YAML does not allow (control characters) as it starts
        loader = _Loader(text)
    except yaml.reader.ReaderError as exc:
        line = text[: exc.position].count("\n") + 1
        raise ConfigError(
            "(file)",
            f"holds a character YAML does not allow (#x{exc.character:04x} at offset {exc.position})"
            if isinstance(exc.character, int)
            else f"holds a character YAML does not allow (at offset {exc.position})",
            'remove control characters; write them as escapes inside double quotes ("\\x01")',
            source=f"{where}:{line}",
        ) from None
    try:
        node = loader.get_single_node()
        if node is None:
            return YamlDocument({}, {})
        walk = _Walk(where)
        walk.visit(node, "", 0)
        if not isinstance(node, MappingNode):
            kind = {ScalarNode: "single value", SequenceNode: "list"}.get(type(node), "value")
            raise ConfigError(
                "",
                f"top level is a {kind}",
                "it must be a mapping of sections (model:, engine:, ...)",
                source=f"{where}:{node.start_mark.line + 1}",
            )
        data = loader.construct_document(node)
    except yaml.YAMLError as exc:
        raise _yaml_problem(exc, where) from None
    finally:
        loader.dispose()
    return YamlDocument(data, walk.lines)
