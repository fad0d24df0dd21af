"""Process groups we start, how they die with us, and how to find the ones a dead run left behind.

Every process trtllm-forge starts carries a run mark in its environment (`TRTLLM_FORGE_RUN=<random id>`);
children inherit it, so a leftover process is recognised as ours by reading /proc/<pid>/environ before it is
signalled (a recycled pid or process-group id never carries the mark).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from types import FrameType
from typing import IO, Any, NoReturn

RUN_MARK = "TRTLLM_FORGE_RUN"
UNREADABLE = "<unreadable>"  # run_mark_of a live process whose environment we may not read (another user's)
_PR_SET_PDEATHSIG = 1


def new_run_id() -> str:
    return uuid.uuid4().hex[:16]


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (state first), or None when the process does not exist."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return raw[raw.rfind(")") + 2 :].split()


def proc_stat(pid: int) -> tuple[str, int, int] | None:
    """(state letter, parent pid, process group) of a process from /proc, or None when it does not exist."""
    fields = _stat_fields(pid)
    return None if fields is None else (fields[0], int(fields[1]), int(fields[2]))


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds a process has used so far (/proc), None when it does not exist."""
    fields = _stat_fields(pid)
    return None if fields is None else (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def all_pids() -> Iterable[int]:
    return (int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit())


def group_members(pgid: int | None) -> list[int]:
    """Live (non-zombie) processes of a process group."""
    if not pgid:
        return []
    if not Path("/proc").is_dir():
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return []
        return [pgid]
    members = []
    for pid in all_pids():
        stat = proc_stat(pid)
        if stat and stat[2] == pgid and stat[0] != "Z":
            members.append(pid)
    return members


def run_mark_of(pid: int) -> str | None:
    """The run mark in a process's environment; None without a mark (or gone); UNREADABLE when we may not
    read its environment."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except PermissionError:
        return UNREADABLE
    except OSError:
        return None
    prefix = f"{RUN_MARK}=".encode()
    for item in environ.split(b"\0"):
        if item.startswith(prefix):
            return item[len(prefix) :].decode(errors="replace")
    return None


def marked_processes(run_id: str, pgid: int | None = None) -> list[int]:
    """Live processes carrying `run_id` (only those of group `pgid` when given)."""
    candidates = group_members(pgid) if pgid else [p for p in all_pids() if (proc_stat(p) or ("Z",))[0] != "Z"]
    return [pid for pid in candidates if pid != os.getpid() and run_mark_of(pid) == run_id]


def cmdline(pid: int) -> list[str]:
    try:
        return [a.decode(errors="replace") for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]
    except OSError:
        return []


def signal_pids(pids: Iterable[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def terminate(find: Callable[[], list[int]], grace_s: float, after_kill_s: float = 10.0) -> list[int]:
    """SIGTERM what `find()` returns, SIGKILL what is left after `grace_s`; the pids that survived both."""
    pids = find()
    if not pids:
        return []
    signal_pids(pids, signal.SIGTERM)
    if _wait_empty(find, grace_s):
        return []
    signal_pids(find(), signal.SIGKILL)
    _wait_empty(find, after_kill_s)
    return find()


def _wait_empty(find: Callable[[], list[int]], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while find():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _load_prctl() -> Callable[..., int] | None:
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux: no parent-death signal, the SIGTERM/SIGINT paths still apply
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    return prctl


# Resolved once in the parent, so the forked child only makes the call (no dlopen after fork).
_PRCTL = _load_prctl()


def dying_with_parent(new_group: bool = True) -> Callable[[], None]:
    """A preexec_fn: the child receives SIGKILL when this process dies, even by SIGKILL (Linux parent-death
    signal), and with new_group leads a new process group (so signals reach it and its own children together;
    pass False with start_new_session=True, which already made it a group leader).

    The kernel sends the signal when the forking *thread* exits: call Popen from a thread that outlives the
    child. If this process died between fork and prctl, the child kills itself at once.
    """
    parent = os.getpid()
    prctl = _PRCTL

    def preexec() -> None:
        if new_group:
            os.setpgid(0, 0)
        if prctl is not None:
            prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            if os.getppid() != parent:
                os.kill(os.getpid(), signal.SIGKILL)

    return preexec


def spawn_in_session(
    argv: list[str], log: IO[Any], *, env: dict[str, str] | None = None, cwd: Path | str | None = None, die_with_caller: bool = False
) -> subprocess.Popen[bytes]:
    """Start argv as the leader of a new session (so its group can be signalled whole), stdout and stderr into the
    open `log`, no stdin; with die_with_caller it gets SIGKILL when this process dies (dying_with_parent)."""
    return subprocess.Popen(
        argv,
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=env,
        cwd=cwd,
        start_new_session=True,
        preexec_fn=dying_with_parent(new_group=False) if die_with_caller else None,
    )


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM stops the body as Ctrl-C does (KeyboardInterrupt): a long loop of measurements (tune, the benchmark
    scripts) then stops its servers and keeps what it finished. A no-op off the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: FrameType | None) -> NoReturn:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
