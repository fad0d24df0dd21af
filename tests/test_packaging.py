"""A non-editable install must carry the subpackages mapped from the top level and every data file."""

from __future__ import annotations

import subprocess
import sys
import zipfile

import pytest
from conftest import REPO


@pytest.fixture(scope="module")
def wheel_names(tmp_path_factory) -> set[str]:
    out = tmp_path_factory.mktemp("wheel")
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(out), str(REPO)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    (wheel,) = out.glob("trtllm_forge-*.whl")
    return set(zipfile.ZipFile(wheel).namelist())


def test_wheel_maps_top_level_packages(wheel_names):
    for package in ("builders", "plugins", "model_repo_templates"):
        assert f"trtllm_forge/{package}/__init__.py" in wheel_names, package
    assert not any(name.startswith(("builders/", "model_repo_templates/")) for name in wheel_names)


def test_wheel_carries_every_repo_file_of_the_mapped_folders(wheel_names):
    """Templates, model.py files and data files: each file under the mapped folders is in the wheel."""
    missing = []
    for folder in ("model_repo_templates", "builders", "plugins"):
        for path in (REPO / folder).rglob("*"):
            relative = path.relative_to(REPO).as_posix()
            if path.is_file() and "__pycache__" not in path.parts and f"trtllm_forge/{relative}" not in wheel_names:
                missing.append(str(path.relative_to(REPO)))
    for path in (REPO / "trtllm_forge").rglob("*"):
        if path.is_file() and "__pycache__" not in path.parts and path.relative_to(REPO).as_posix() not in wheel_names:
            missing.append(str(path.relative_to(REPO)))
    assert not missing, missing


def test_console_script_declared(wheel_names):
    entry_points = next(n for n in wheel_names if n.endswith("entry_points.txt"))
    assert entry_points
