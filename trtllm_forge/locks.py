"""Advisory locks on workdir state (fcntl.flock on a lock file), so two commands never act on it at once.

The lock file holds the pid of the holder, for the message the other command prints. The kernel releases
the lock when its holder dies (SIGKILL too), so a dead run never leaves a workdir locked. Re-entrant within
one process: a holder may take the same lock again (e.g. a failed start stopping its server).
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from trtllm_forge.errors import ForgeError

_held: dict[tuple[Path, int], tuple[int, int]] = {}  # (lock path, thread) -> (fd, depth)


def lock_holder(path: Path) -> int | None:
    try:
        text = Path(path).read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


@contextmanager
def file_lock(path: Path, *, wait_s: float, busy: Callable[[int | None], ForgeError]) -> Iterator[None]:
    """Hold an exclusive lock on `path`, waiting up to `wait_s` seconds; then raise `busy(holder_pid)`."""
    key = (Path(path).resolve(), threading.get_ident())
    if key in _held:
        fd, depth = _held[key]
        _held[key] = (fd, depth + 1)
    else:
        key[0].parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(key[0], os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    os.close(fd)
                    raise busy(lock_holder(key[0])) from None
                time.sleep(0.1)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        _held[key] = (fd, 1)
    try:
        yield
    finally:
        _release(key)


def _release(key: tuple[Path, int]) -> None:
    fd, depth = _held[key]
    if depth > 1:
        _held[key] = (fd, depth - 1)
        return
    del _held[key]
    os.ftruncate(fd, 0)
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)
