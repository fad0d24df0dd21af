"""The per-user cache folder of trtllm-forge ($XDG_CACHE_HOME/trtllm-forge, else ~/.cache/trtllm-forge)."""

from __future__ import annotations

import os
from pathlib import Path


def user_cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "trtllm-forge"
