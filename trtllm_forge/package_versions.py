"""The installed version of a Python distribution, as the stage hashes and records name it."""

from __future__ import annotations

from importlib import metadata


def installed_version(package: str) -> str | None:
    """None when the distribution is not installed."""
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None
