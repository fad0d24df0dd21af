"""The stage runner: every stage builds into a temporary directory, renames it into place on success,
records a manifest.json, logs every subprocess, and is skipped when its inputs are unchanged.

Layout of a workdir:
    <workdir>/<stage>/manifest.json   inputs, input hash, tool versions, commands, timings, outputs
    <workdir>/<stage>/...             the stage's outputs
    <workdir>/logs/<stage>-<step>.log one log per subprocess (kept on failure too; the previous runs' logs
                                      are rotated to <stage>-<step>.1.log, .2.log, ...)
    <workdir>/.locks/<stage>.lock     held while the stage runs: one run per stage and workdir at a time
    <workdir>/.<stage>.tmp-<run id>   the running stage's output; its children carry the run id (processes.RUN_MARK)

Every subprocess runs in its own process group and dies with the run: SIGTERM/SIGINT (Ctrl-C) of the run
stops the group, and SIGKILL of the run reaches the child through the parent-death signal. Whatever a killed
run still left (a grandchild, its temporary directory) the next run of the stage stops and removes.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn, TextIO

from trtllm_forge import __version__, third_party_env
from trtllm_forge.atomic_files import write_json_atomic
from trtllm_forge.errors import StepError
from trtllm_forge.locks import file_lock
from trtllm_forge.processes import RUN_MARK, dying_with_parent, marked_processes, new_run_id, terminate
from trtllm_forge.ui import console, info

MANIFEST = "manifest.json"
LOG_TAIL_LINES = 30
KEEP_LOGS = 10  # rotated logs kept per log file, besides the current one
CHILD_STOP_GRACE_S = 5.0  # between SIGTERM and SIGKILL of a stage's child when the run is interrupted


def hash_path(path: Path, digest: hashlib._Hash) -> None:
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


def rotate_log(path: Path, keep: int = KEEP_LOGS) -> None:
    """Move an existing log aside (x.log -> x.1.log -> x.2.log ...) so a new run never overwrites it; the
    `keep` most recent previous logs are kept."""
    path = Path(path)
    if not path.exists():
        return

    def numbered(n: int) -> Path:
        return path.with_name(f"{path.stem}.{n}{path.suffix}")

    numbered(keep).unlink(missing_ok=True)
    for n in range(keep - 1, 0, -1):
        if numbered(n).exists():
            os.replace(numbered(n), numbered(n + 1))
    os.replace(path, numbered(1))


def open_new_log(path: Path) -> TextIO:
    """Open a fresh log at `path` for writing, rotating the previous one away first."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rotate_log(path)
    return path.open("w")


def stop_child_group(pgid: int, run_id: str, grace_s: float = CHILD_STOP_GRACE_S) -> None:
    """SIGTERM the processes of a child's group that carry our run id, SIGKILL what is left after grace_s."""
    terminate(lambda: marked_processes(run_id, pgid), grace_s)


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
    run_id: str = field(default_factory=new_run_id)  # put into every child's environment (processes.RUN_MARK)
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
        """Run argv (never through a shell), teeing output to the step's log; raise StepError on failure.

        The child leads its own process group and dies with this process: an exception here (Ctrl-C, the
        SIGTERM handler of run_stage, the timeout) stops its whole group; SIGKILL of this process reaches it
        through the parent-death signal."""
        argv = [str(a) for a in argv]
        log = self.log_path(step)
        info(f"[dim]$ {shlex.join(argv)}[/dim]")
        started = time.monotonic()
        with open_new_log(log) as handle:
            handle.write(f"$ {shlex.join(argv)}\n")
            handle.flush()
            try:
                proc = subprocess.Popen(
                    argv,
                    stdout=handle,
                    stderr=subprocess.STDOUT,
                    env={**third_party_env(), **(env or {}), RUN_MARK: self.run_id},
                    cwd=cwd,
                    stdin=subprocess.DEVNULL,
                    preexec_fn=dying_with_parent(),
                )
            except FileNotFoundError:
                raise StepError(f"{self.stage}.{step}", f"command not found: {argv[0]}", "install it or fix PATH") from None
            try:
                returncode = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                stop_child_group(proc.pid, self.run_id)
                proc.wait()
                returncode = -9
            except BaseException:
                stop_child_group(proc.pid, self.run_id)
                proc.wait()
                raise
            stop_child_group(proc.pid, self.run_id, grace_s=0)  # what the child left running in its group
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

    def interrupt(signum: int, frame: FrameType | None) -> NoReturn:
        raise StepError(stage, "terminated by SIGTERM; the partial output was discarded", f"logs are kept in {workdir / 'logs'}")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


TMP_INFIX = ".tmp-"


def remove_stale(workdir: Path, name: str) -> list[Path]:
    """Remove the temporary directories a killed run of this stage left (SIGKILL cannot clean up after itself),
    after stopping any process of that run still alive (found by the run id in the directory's name), so none
    writes into the workdir later. Call with the stage lock held: then no live run owns them."""
    stale = [p for pattern in (f".{name}{TMP_INFIX}*", f".{name}.old-*") for p in workdir.glob(pattern) if p.is_dir()]
    for path in stale:
        if TMP_INFIX in path.name:
            run_id = path.name.split(TMP_INFIX, 1)[1]
            left = terminate(functools.partial(marked_processes, run_id), CHILD_STOP_GRACE_S)
            if left:
                raise StepError(name, f"processes {left} of a killed earlier run survived SIGKILL", "check them with ps")
        shutil.rmtree(path, ignore_errors=True)
    return stale


def stage_lock(workdir: Path, name: str) -> AbstractContextManager[None]:
    """One run of a stage per workdir at a time; a second one fails at once with the holder's pid."""

    def busy(holder: int | None) -> StepError:
        who = f"pid {holder}" if holder else "another process"
        return StepError(name, f"{who} is already running this stage in {workdir}", "wait for it to finish, or use another --workdir")

    return file_lock(workdir / ".locks" / f"{name}.lock", wait_s=0, busy=busy)


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
    with stage_lock(workdir, name):
        remove_stale(workdir, name)
        final = workdir / name
        input_hash = hash_inputs(values, input_paths)
        previous = read_manifest(final)
        if previous and previous.get("input_hash") == input_hash and not force:
            info(f"[green]✓[/green] {name}: inputs unchanged, skipped (use --force to redo) → {final}")
            return StageResult(name, final, True, previous)

        recorder = StageRecorder(stage=name, logs_dir=workdir / "logs")
        # Named by the run id its children carry, so a later run can find what a killed one left running.
        tmp = workdir / f".{name}{TMP_INFIX}{recorder.run_id}"
        tmp.mkdir()
        tmp.chmod(0o755)  # stage outputs are read by servers and containers as other users
        started = time.time()
        try:
            with terminate_as_error(name, workdir), console.status(f"{name} …"):
                outputs = dict(body(tmp, recorder))
            manifest: dict[str, Any] = {
                "stage": name,
                "status": "ok",
                "input_hash": input_hash,
                "workdir": str(workdir.absolute()),  # stage_results.moved_paths: where the outputs' paths point
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
