"""The TensorRT-LLM facts the builder checks against, loaded from a versioned data file.

`spec/trtllm-<major.minor>.json` holds one release line; adding a second TensorRT-LLM version means adding
one file. `FlagParser` is an argparse parser built from the `trtllm-build` flag table, so every argv we
generate is checked against the table before any GPU time is spent.
"""

from __future__ import annotations

import argparse
import difflib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import NoReturn

from trtllm_forge.errors import ConfigError

DEFAULT_VERSION = "1.2.1"


@dataclass(frozen=True)
class Flag:
    flag: str
    kind: str  # int | float | str | flag (store_true) | toggle (enable|disable) | list (nargs=+) | pair (nargs=2)
    choices: tuple[str, ...] | None
    default: object
    deprecated: bool
    aliases: tuple[str, ...]
    replacement: str | None
    source: str  # key of the spec's "sources": repository, commit and path of NVIDIA's parser
    uncertain: bool  # the row itself was not tied to 1.2.1 (its source may be uncertain too)


# One flag table per NVIDIA script, each read from that script's own argparse (spec "sources").
TOOL_TABLES = {
    "trtllm-build": "trtllm_build",
    "quantize.py": "quantize_py",
    "convert_checkpoint.py": "convert_checkpoint_llama",
    "qwen/convert_checkpoint.py": "convert_checkpoint_qwen",
    "eagle/convert_checkpoint.py": "convert_checkpoint_eagle",
}


@dataclass(frozen=True)
class Source:
    key: str
    repo: str
    commit: str | None
    path: str
    uncertain: bool
    why: str

    def cite(self) -> str:
        return f"{self.repo}@{(self.commit or 'unpinned')[:12]}:{self.path}"


class Spec:
    """One TensorRT-LLM release line's tables."""

    def __init__(self, data: dict):
        self.data = data
        self.version: str = data["tensorrt_llm_version"]
        self.compatible_versions: list[str] = data["compatible_versions"]
        self.capability: dict = data["capability"]
        self.adjustments: dict = data["adjustments"]
        self.engine_config: dict = data["engine_config"]

    def source(self, key: str) -> Source:
        row = self.data["sources"][key]
        return Source(key, row["repo"], row.get("commit"), row["path"], bool(row.get("uncertain")), row.get("why", ""))

    def table_source(self, tool: str) -> Source:
        return self.source(self.data[TOOL_TABLES[tool]]["source"])

    def flags(self, tool: str) -> dict[str, Flag]:
        table = self.data[TOOL_TABLES[tool]]
        out = {}
        for entry in table["flags"]:
            out[entry["flag"]] = Flag(
                flag=entry["flag"],
                kind=entry["kind"],
                choices=tuple(str(c) for c in entry["choices"]) if entry.get("choices") else None,
                default=entry.get("default"),
                deprecated=bool(entry.get("deprecated")),
                aliases=tuple(entry.get("aliases", ())),
                replacement=entry.get("replacement"),
                source=entry.get("source", table["source"]),
                uncertain=bool(entry.get("uncertain")),
            )
        return out

    @property
    def architectures(self) -> dict[str, str]:
        return self.data["architectures"]["map"]

    @property
    def speculative_build_modes(self) -> dict[str, str]:
        return self.data["speculative_build_modes"]["map"]  # our mode → trtllm-build --speculative_decoding_mode

    @property
    def removed_build_flags(self) -> dict[str, str]:
        return self.data["trtllm_build"]["removed_flags"]

    def parser(self, tool: str = "trtllm-build") -> FlagParser:
        return FlagParser(tool, self.flags(tool), self.removed_build_flags if tool == "trtllm-build" else {})

    @property
    def container_image(self) -> str:
        """Our image that builds this version's engines (docker/Dockerfile on base_image, spec/serving-images.json)."""
        from trtllm_forge.builders.tensorrt_llm.images import build_image_for_version

        return build_image_for_version(self.version).image

    @property
    def base_image(self) -> str:
        """The image docker/Dockerfile starts from: the newest NGC image that ships this version, else its route's base."""
        from trtllm_forge.builders.tensorrt_llm.images import build_image_for_version

        row = build_image_for_version(self.version)
        return row.base_image or row.image


def _spec_file(version: str) -> str:
    major_minor = ".".join(version.split(".")[:2])
    return f"spec/trtllm-{major_minor}.json"


@lru_cache(maxsize=4)
def load_spec(version: str = DEFAULT_VERSION) -> Spec:
    path = resources.files("trtllm_forge.builders.tensorrt_llm").joinpath(_spec_file(version))
    if not path.is_file():
        known = sorted(p.name for p in resources.files("trtllm_forge.builders.tensorrt_llm").joinpath("spec").iterdir())
        raise ConfigError("engine.trtllm_version", f"no spec for TensorRT-LLM {version}", f"known: {', '.join(known)}")
    spec = Spec(json.loads(path.read_text()))
    if version not in spec.compatible_versions:
        raise ConfigError(
            "engine.trtllm_version",
            f"{version} is not a version this builder was checked against",
            f"one of {', '.join(spec.compatible_versions)}",
        )
    return spec


class _Refused(Exception):
    pass


class _RaisingParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse would print usage and exit(2)
        raise _Refused(message)


@dataclass(frozen=True)
class ParsedArgv:
    values: dict
    deprecated_used: list[str]


class FlagParser:
    """Checks an argv (without the program name) against a tool's flag table."""

    def __init__(self, tool: str, flags: dict[str, Flag], removed: dict[str, str]):
        self.tool = tool
        self.flags = flags
        self.removed = removed
        self._parser = _RaisingParser(prog=tool, add_help=False, allow_abbrev=False)
        for flag in flags.values():
            names = [flag.flag, *flag.aliases]
            if flag.kind == "flag":
                self._parser.add_argument(*names, action="store_true")
            elif flag.kind == "list":
                self._parser.add_argument(*names, nargs="+", choices=flag.choices)
            elif flag.kind == "pair":
                self._parser.add_argument(*names, nargs=2)
            else:
                type_ = {"int": int, "float": float}.get(flag.kind, str)
                choices = [type_(c) for c in flag.choices] if flag.choices else None
                self._parser.add_argument(*names, type=type_, choices=choices)

    def parse(self, argv: Sequence[str]) -> ParsedArgv:
        """Return the parsed values, or raise ConfigError naming the first flag or value outside the spec."""
        argv = [str(a) for a in argv]
        for arg in argv:
            name = arg.split("=", 1)[0]
            if name.startswith("--") and name not in self.flags and not self._is_alias(name):
                raise self._unknown(name)
        try:
            namespace, extra = self._parser.parse_known_args(argv)
        except _Refused as exc:
            raise ConfigError(self.tool, f"argv refused by the TensorRT-LLM spec: {exc}", self._valid_hint(str(exc))) from None
        if extra:
            raise ConfigError(self.tool, f"unexpected argument {extra[0]!r}", "every value must follow a known flag")
        used = {a.split("=", 1)[0] for a in argv if a.startswith("--")}
        deprecated = sorted(f.flag for f in self.flags.values() if f.deprecated and f.flag in used)
        return ParsedArgv(values={k: v for k, v in vars(namespace).items() if v not in (None, False)}, deprecated_used=deprecated)

    def _is_alias(self, name: str) -> bool:
        return any(name in f.aliases for f in self.flags.values())

    def _unknown(self, name: str) -> ConfigError:
        if name in self.removed:
            return ConfigError(self.tool, f"{name} does not exist in TensorRT-LLM 1.2.x", self.removed[name])
        close = difflib.get_close_matches(name, list(self.flags), n=1, cutoff=0.7)
        hint = f"did you mean {close[0]}?" if close else f"see the {self.tool} flag table in the builder spec"
        return ConfigError(self.tool, f"unknown flag {name} in TensorRT-LLM 1.2.x", hint)

    def _valid_hint(self, message: str) -> str:
        for flag in self.flags.values():
            if flag.flag in message and flag.choices:
                return f"{flag.flag} takes one of {', '.join(flag.choices)}"
            if flag.flag in message:
                return f"{flag.flag} takes a value of type {flag.kind}"
        return f"see the {self.tool} flag table in the builder spec"
