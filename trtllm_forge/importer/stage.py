"""The import stage: check or convert model.source into <workdir>/import/ (see the package docstring)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trtllm_forge.config import ForgeConfig
from trtllm_forge.dtypes import resolve_model_dtype, stored_dtype
from trtllm_forge.errors import StepError
from trtllm_forge.importer.gguf_to_hf import CONVERTER_VERSION
from trtllm_forge.importer.sources import (
    ImportSource,
    check_family_converted,
    check_family_gguf,
    check_family_hf,
    resolve_source,
)
from trtllm_forge.package_versions import installed_version
from trtllm_forge.stage_results import ImportResult
from trtllm_forge.stages import StageRecorder, hash_inputs, read_manifest, run_stage

STAGE = "import"
CHECKPOINT = "checkpoint"
REPORT = "convert-report.json"
STAGING = f".{STAGE}.tmp-<random>"  # how --dry-run names run_stage's temporary directory
CONVERTED_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
)
CHILD_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


@dataclass
class ImportPlan:
    """What the import would do; the same facts drive the real run and --dry-run."""

    source: ImportSource
    workdir: Path
    dtype: str
    values: dict
    input_paths: dict[str, Path]
    tokenizer_dir: Path | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def stage_dir(self) -> Path:
        return self.workdir / STAGE

    @property
    def checkpoint_dir(self) -> Path:
        return self.stage_dir / CHECKPOINT if self.source.is_gguf else self.source.path

    def convert_argv(self, staging: Path) -> list[str]:
        return [
            sys.executable,
            "-m",
            "trtllm_forge.importer.gguf_to_hf",
            "--gguf",
            str(self.source.path),
            "--out",
            str(staging / CHECKPOINT),
            "--dtype",
            self.dtype,
            "--report",
            str(staging / REPORT),
        ]

    def would_skip(self) -> bool:
        previous = read_manifest(self.stage_dir)
        return previous is not None and previous.get("input_hash") == hash_inputs(self.values, self.input_paths)

    def files(self) -> list[str]:
        out = [str(self.stage_dir / "manifest.json")]
        if self.source.is_gguf:
            out += [str(self.checkpoint_dir / name) for name in CONVERTED_FILES]
            out += [str(self.stage_dir / REPORT), str(self.workdir / "logs" / f"{STAGE}-convert.log")]
        return out

    def to_json(self, force: bool = False) -> dict:
        skip = self.would_skip() and not force
        return {
            "stage": STAGE,
            "source": self.source.spec,
            "source_kind": self.source.kind,
            "source_path": str(self.source.path),
            "checkpoint_dir": str(self.checkpoint_dir),
            "dtype": self.dtype,
            "would_skip": skip,
            "commands": [] if skip or not self.source.is_gguf else [self.convert_argv(self.workdir / STAGING)],
            "files": [] if skip else self.files(),
            "notes": self.notes
            + ([] if skip else [f"files are written under {self.workdir / STAGING} and renamed to {self.stage_dir} on success"]),
        }


def plan_import(config: ForgeConfig, workdir: Path) -> ImportPlan:
    """Locate and pre-check the source (ConfigError on problems) without writing anything."""
    from trtllm_forge.importer.gguf_meta import read_gguf_info
    from trtllm_forge.importer.hf_checkpoint import check_hf_dir, fingerprint

    source = resolve_source(config)
    dtype = resolve_model_dtype(config, source.path)
    family = config.model.family
    tokenizer_dir = config.resolve_path(config.model.tokenizer).resolve() if config.model.tokenizer else None
    values: dict[str, Any] = {
        "source": source.spec,
        "source_kind": source.kind,
        "source_path": str(source.path),
        # A Hugging Face source is not converted: its hash keeps the requested value, as before one rule existed.
        "dtype": dtype if source.is_gguf else config.model.dtype,
        "family": family,
        "trust_remote_code": config.model.trust_remote_code,
        "tokenizer": str(tokenizer_dir) if tokenizer_dir else None,
    }
    input_paths: dict[str, Path] = {}
    notes: list[str] = []
    if source.is_gguf:
        info = read_gguf_info(source.path)
        check_family_gguf(family, info.architecture, info.expert_count)
        values["converter_version"] = CONVERTER_VERSION
        values["transformers"] = installed_version("transformers")
        input_paths["gguf"] = source.path
        if tokenizer_dir:
            notes.append("model.tokenizer is recorded, but the converted checkpoint carries the GGUF's own tokenizer")
    else:
        hf_config = check_hf_dir(source.path, tokenizer_dir)
        check_family_hf(family, str(hf_config.get("model_type", "")))
        values["fingerprint"] = fingerprint(source.path)
        notes.append("weights are not copied: checkpoint_dir points at the source directory")
        notes.append("input hash: content of small files, size+mtime of weight files (--force to re-check)")
    if tokenizer_dir and tokenizer_dir != source.path:
        values["tokenizer_fingerprint"] = fingerprint(tokenizer_dir)
    return ImportPlan(source, workdir, dtype, values, input_paths, tokenizer_dir, notes)


def _gguf_body(plan: ImportPlan, config: ForgeConfig) -> Callable[[Path, StageRecorder], dict]:
    def body(tmp: Path, recorder: StageRecorder) -> dict:
        import json

        record = recorder.run(plan.convert_argv(tmp), step="convert", env=CHILD_ENV)
        report = json.loads((tmp / REPORT).read_text())
        check = report["model_check"]
        check_family_converted(config.model.family, check["model_type"])
        recorder.tool_versions.update(report["tool_versions"])
        recorder.timed("convert_s", record.seconds)
        recorder.notes.append(f"tokenizer: {report['tokenizer_mode']}")
        recorder.notes.extend(plan.notes)
        return {
            "checkpoint_dir": str(plan.checkpoint_dir),
            "tokenizer_dir": str(plan.tokenizer_dir or plan.checkpoint_dir),
            "source_kind": plan.source.kind,
            "source_path": str(plan.source.path),
            "model_type": check["model_type"],
            "architecture": check["architecture"],
            "num_parameters": check["num_parameters"],
            "dtype": check["dtype"],
            "tokenizer": report["tokenizer"],
            "gguf": report["gguf"],
            "self_check": {k: check[k] for k in ("probe_tokens", "max_abs_logit_diff", "argmax_equal")},
            "files": report["files"],
        }

    return body


def _hf_body(plan: ImportPlan, config: ForgeConfig) -> Callable[[Path, StageRecorder], dict]:
    def body(tmp: Path, recorder: StageRecorder) -> dict:
        import json

        from trtllm_forge.importer.hf_checkpoint import (
            safetensors_summary,
            tokenizer_facts,
            weight_files,
        )

        hf_config = json.loads((plan.source.path / "config.json").read_text())
        num_parameters, by_dtype = safetensors_summary(weight_files(plan.source.path))
        tokenizer_dir = plan.tokenizer_dir or plan.source.path
        try:
            facts = tokenizer_facts(tokenizer_dir, config.model.trust_remote_code)
        except Exception as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise StepError(
                "import.tokenizer",
                f"cannot load the tokenizer in {tokenizer_dir} ({first})",
                "fix the tokenizer files or set model.tokenizer",
            ) from None
        recorder.tool_versions["transformers"] = installed_version("transformers") or "?"
        recorder.notes.extend(plan.notes)
        stored = stored_dtype(hf_config, by_dtype)
        return {
            "checkpoint_dir": str(plan.source.path),
            "tokenizer_dir": str(tokenizer_dir),
            "source_kind": plan.source.kind,
            "source_path": str(plan.source.path),
            "model_type": hf_config.get("model_type"),
            "architecture": (hf_config.get("architectures") or [None])[0],
            "num_parameters": num_parameters,
            "dtype": plan.dtype,
            "checkpoint_dtype": stored,
            "weight_dtypes": by_dtype,
            "tokenizer": facts.to_json(),
            "files": sorted(p.name for p in plan.source.path.iterdir() if p.is_file()),
        }

    return body


def import_checkpoint(config: ForgeConfig, workdir: Path, force: bool = False) -> ImportResult:
    """Run the import stage; skipped when its inputs are unchanged unless `force`."""
    plan = plan_import(config, workdir)
    body = _gguf_body(plan, config) if plan.source.is_gguf else _hf_body(plan, config)
    return ImportResult.from_stage(run_stage(workdir, STAGE, plan.values, plan.input_paths, body, force=force))


def imported_checkpoint(workdir: Path) -> Path | None:
    """The checkpoint the import stage of this workdir recorded: the converted directory for GGUF sources,
    the source directory itself for Hugging Face ones; None before any import."""
    recorded = ImportResult.in_workdir(workdir)
    return recorded.checkpoint_dir if recorded else None
