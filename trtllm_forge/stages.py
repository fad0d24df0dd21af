"""The stage runner: every stage builds into a temporary directory, renames it into place on success,
records a manifest.json, logs every subprocess, and is skipped when its inputs are unchanged.

Layout of a workdir:
    <workdir>/<stage>/manifest.json   inputs, input hash, tool versions, commands, timings, outputs
    <workdir>/<stage>/...             the stage's outputs
    <workdir>/logs/<stage>-<step>.log one log per subprocess (kept on failure too)
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from trtllm_forge import __version__
from trtllm_forge.errors import StepError
from trtllm_forge.ui import console, info

MANIFEST = "manifest.json"
LOG_TAIL_LINES = 30


def hash_path(path: Path, digest: "hashlib._Hash") -> None:
    """Feed a file's bytes, or a directory's relative names and file bytes, into `digest`."""
    if path.is_file():
        with path.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
        return
    for item in sorted(p for p in path.rglob("*") if p.is_file()):
        digest.update(str(item.relative_to(path)).encode())
        hash_path(item, digest)


def hash_inputs(values: Mapping[str, Any], paths: Mapping[str, Path]) -> str:
    digest = hashlib.sha256()
    digest.update(json.dumps(values, sort_keys=True, default=str).encode())
    for name in sorted(paths):
        digest.update(name.encode())
        path = Path(paths[name])
        if path.exists():
            hash_path(path, digest)
        else:
            digest.update(b"<missing>")
    return digest.hexdigest()


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    hash_path(path, digest)
    return digest.hexdigest()


def write_json_atomic(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as handle:
        json.dump(data, handle, indent=2, sort_keys=True, default=str)
        handle.write("\n")
    os.replace(tmp, path)


@dataclass
class CommandRecord:
    argv: list[str]
    log: str
    returncode: int
    seconds: float
    cwd: str | None = None


@dataclass
class StageRecorder:
    """Handed to a stage's body: runs logged subprocesses and collects what goes into the manifest."""

    stage: str
    logs_dir: Path
    commands: list[CommandRecord] = field(default_factory=list)
    tool_versions: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)

    def log_path(self, step: str) -> Path:
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        return self.logs_dir / f"{self.stage}-{step}.log"

    def run(
        self,
        argv: Sequence[str],
        step: str,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        timeout: float | None = None,
    ) -> CommandRecord:
        """Run argv (never through a shell), teeing output to the step's log; raise StepError on failure."""
        argv = [str(a) for a in argv]
        log = self.log_path(step)
        info(f"[dim]$ {shlex.join(argv)}[/dim]")
        started = time.monotonic()
        with log.open("w") as handle:
            handle.write(f"$ {shlex.join(argv)}\n")
            handle.flush()
            try:
                proc = subprocess.run(
                    argv,
                    stdout=handle,
                    stderr=subprocess.STDOUT,
                    env=None if env is None else {**os.environ, **env},
                    cwd=cwd,
                    timeout=timeout,
                    stdin=subprocess.DEVNULL,
                )
                returncode = proc.returncode
            except subprocess.TimeoutExpired:
                returncode = -9
            except FileNotFoundError:
                raise StepError(f"{self.stage}.{step}", f"command not found: {argv[0]}", "install it or fix PATH") from None
        record = CommandRecord(argv, str(log), returncode, round(time.monotonic() - started, 3), str(cwd) if cwd else None)
        self.commands.append(record)
        if returncode != 0:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:])
            console.print(tail, markup=False, highlight=False)
            what = "timed out" if returncode == -9 else f"exited with {returncode}"
            raise StepError(f"{self.stage}.{step}", f"{shlex.join(argv[:3])} ... {what}", f"see the log {log}")
        return record

    def timed(self, name: str, seconds: float) -> None:
        self.timings[name] = round(seconds, 3)


@dataclass
class StageResult:
    name: str
    directory: Path
    skipped: bool
    manifest: dict


def read_manifest(directory: Path) -> dict | None:
    path = directory / MANIFEST
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError:
        return None


@contextmanager
def terminate_as_error(stage: str, workdir: Path) -> Iterator[None]:
    """Turn SIGTERM into a StepError while a stage runs, so its temporary directory is removed and running
    children are killed, as for Ctrl-C (Python's default SIGTERM does neither)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, frame):
        raise StepError(stage, "terminated by SIGTERM; the partial output was discarded", f"logs are kept in {workdir / 'logs'}")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def remove_stale(workdir: Path, name: str) -> list[Path]:
    """Temporary directories a killed run of this stage left (SIGKILL cannot clean up after itself).
    Assumes one run per stage and workdir at a time."""
    stale = [p for pattern in (f".{name}.tmp-*", f".{name}.old-*") for p in workdir.glob(pattern) if p.is_dir()]
    for path in stale:
        shutil.rmtree(path, ignore_errors=True)
    return stale


def stage_output(workdir: Path, stage: str, key: str) -> str | None:
    """One output a finished stage recorded in its manifest (also when a later run skipped it), or None."""
    manifest = read_manifest(Path(workdir) / stage) or {}
    return (manifest.get("outputs") or {}).get(key)


def run_stage(
    workdir: Path,
    name: str,
    values: Mapping[str, Any],
    input_paths: Mapping[str, Path],
    body: Callable[[Path, StageRecorder], Mapping[str, Any]],
    force: bool = False,
) -> StageResult:
    """Run `body(tmp_dir, recorder)` unless an earlier run with the same inputs is in place.

    `body` writes its outputs into tmp_dir and returns a mapping describing them (recorded as
    `outputs`). Only on success is tmp_dir renamed to <workdir>/<name>; an interrupted or failed run
    leaves the previous output (if any) untouched and removes its temporary directory.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    remove_stale(workdir, name)
    final = workdir / name
    input_hash = hash_inputs(values, input_paths)
    previous = read_manifest(final)
    if previous and previous.get("input_hash") == input_hash and not force:
        info(f"[green]✓[/green] {name}: inputs unchanged, skipped (use --force to redo) → {final}")
        return StageResult(name, final, True, previous)

    recorder = StageRecorder(stage=name, logs_dir=workdir / "logs")
    tmp = Path(tempfile.mkdtemp(dir=workdir, prefix=f".{name}.tmp-"))
    tmp.chmod(0o755)  # mkdtemp makes it 0700; stage outputs are read by servers and containers as other users
    started = time.time()
    try:
        with terminate_as_error(name, workdir), console.status(f"{name} …"):
            outputs = dict(body(tmp, recorder))
        manifest = {
            "stage": name,
            "status": "ok",
            "input_hash": input_hash,
            "inputs": {"values": dict(values), "paths": {k: str(v) for k, v in input_paths.items()}},
            "tool_versions": {"trtllm-forge": __version__, **recorder.tool_versions},
            "commands": [asdict(c) for c in recorder.commands],
            "timings": {**recorder.timings, "total_s": round(time.time() - started, 3)},
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
            "notes": recorder.notes,
            "outputs": outputs,
        }
        write_json_atomic(tmp / MANIFEST, manifest)
        replace_directory(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    info(f"[green]✓[/green] {name}: done in {manifest['timings']['total_s']:.1f}s → {final}")
    return StageResult(name, final, False, manifest)


def replace_directory(new: Path, final: Path) -> None:
    """Swap `new` into `final`; the old content is removed only after the new one is in place."""
    if final.exists():
        trash = final.with_name(f".{final.name}.old-{os.getpid()}")
        os.replace(final, trash)
        os.replace(new, final)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        os.replace(new, final)
