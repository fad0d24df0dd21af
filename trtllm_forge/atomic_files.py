"""Files written whole or not at all: the one way trtllm-forge writes a file a user or a later stage reads.

A write goes to a temporary file beside the target and is renamed over it. When the write fails (a full disk, a
quota, a read-only folder) the temporary file is removed and the OSError names the target, so the command's one-line
error says which path could not be written (cli.main) and nothing half-written is left.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def write_text_atomic(path: Path, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise OSError(exc.errno, exc.strerror, str(path)) from exc
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json_atomic(path: Path, data: Any) -> None:
    """`data` as indented JSON with sorted keys (values JSON cannot hold written as their str())."""
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
