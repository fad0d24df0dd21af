#!/usr/bin/env python
"""Run mypy over the installed package layout (trtllm_forge plus the top-level folders that install as its
subpackages) and over the scripts in scripts/ (benchmarks and tools, each checked as a top-level module: they import
each other that way), so a refactor that breaks a script's calls fails here instead of at its next run.

pyproject.toml maps `builders/`, `plugins/` and `model_repo_templates/` to `trtllm_forge.builders` etc. (package-dir);
the editable install serves that mapping through an import hook, which mypy does not run. So mypy would see
`builders.openvino.plan` where the code imports `trtllm_forge.builders.openvino.plan`. This script rebuilds the mapping
as a link tree, build/typecheck/trtllm_forge/<sub> -> <folder>, read from pyproject's package-dir (defined once there),
and passes those links to mypy, which names each file by walking its __init__.py files up to build/typecheck. Error
paths are printed as the real repository paths. mypy's options are [tool.mypy] in pyproject.toml.

    python scripts/typecheck.py [extra mypy arguments]
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "trtllm_forge"
SCRIPTS = Path(__file__).resolve().parent
TREE = ROOT / "build" / "typecheck"


def mapped_folders() -> dict[str, Path]:
    """The package-dir entries that put a top-level folder under trtllm_forge: {"builders": ROOT/"builders", ...}."""
    package_dir = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    return {name.removeprefix(PACKAGE + "."): ROOT / folder for name, folder in package_dir.items() if name.startswith(PACKAGE + ".")}


def link_tree() -> dict[Path, Path]:
    """build/typecheck/trtllm_forge/{__init__.py, <sub> -> folder}; returns {link: folder}."""
    shutil.rmtree(TREE, ignore_errors=True)
    package = TREE / PACKAGE
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")  # only marks the package for mypy's module naming; trtllm_forge/__init__.py is checked
    links = {}
    for sub, folder in mapped_folders().items():
        link = package / sub
        link.symlink_to(folder, target_is_directory=True)
        links[link] = folder
    return links


def main(argv: list[str]) -> int:
    links = link_tree()
    targets = [PACKAGE, *(str(link.relative_to(ROOT)) for link in links), str(SCRIPTS.relative_to(ROOT))]
    command = [sys.executable, "-m", "mypy", *argv, *targets]
    print(" ".join(command), flush=True)
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    output = result.stdout + result.stderr
    for link, folder in links.items():
        output = output.replace(str(link.relative_to(ROOT)) + os.sep, str(folder.relative_to(ROOT)) + os.sep)
    sys.stdout.write(output)
    return result.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
