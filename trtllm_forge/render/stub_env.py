"""The Python environment the Triton python stub runs our models in (the EXECUTION_ENV_PATH parameter).

The python-backend stub of nvidia-pytriton 0.7.0 (Triton 2.51) was built against numpy 1: with numpy 2
it reads numpy's array descriptor with the old layout, so every STRING input reaches model.py as a copy
of its first byte (the stub then dies in deserialize_bytes_tensor), and numeric tensors built with
pb_utils.Tensor lose their data. Our venv needs numpy 2 (torch, OpenVINO), so the stub gets a small
side venv holding numpy 1.26 only, whose .pth file appends the project venv's site-packages: numpy
resolves to 1.26, everything else (tokenizers, transformers, openvino_genai) to the project venv.
"""

from __future__ import annotations

import sys
import sysconfig
from pathlib import Path

STUB_NUMPY = "numpy==1.26.4"
PTH_NAME = "zz_trtllm_forge_project_env.pth"


def running_numpy_major() -> int:
    try:
        from importlib.metadata import version

        return int(version("numpy").split(".")[0])
    except Exception:  # noqa: BLE001 - no numpy at all: nothing to work around
        return 0


def project_env() -> Path:
    return Path(sys.prefix).resolve()


def default_stub_env() -> Path:
    prefix = project_env()
    return prefix.parent / f"{prefix.name}-triton-stub"


def needs_side_env() -> bool:
    return running_numpy_major() >= 2


def stub_env_ready(path: Path) -> bool:
    return (path / "bin" / "activate").is_file() and any(path.glob(f"lib/python*/site-packages/{PTH_NAME}"))


def stub_env_path() -> Path:
    """The directory to put into EXECUTION_ENV_PATH for local deployments."""
    return default_stub_env() if needs_side_env() else project_env()


def numpy1_site() -> Path | None:
    """A directory already holding numpy 1.x for the stubs (the one deploy uses, `pip --target`), if any."""
    import os

    site = Path(os.environ.get("TRTLLM_FORGE_STUB_SITE") or project_env() / "triton-stub-site")
    found = sorted(site.glob("numpy-1.*.dist-info"))
    return site if found else None


def creation_steps(path: Path) -> list[list[str]]:
    """argv of the commands that create the side environment (for --dry-run and the stage log)."""
    python = str(Path(sys.executable))
    if numpy1_site() is not None:  # reuse that numpy: no download
        return [[python, "-m", "venv", "--without-pip", str(path)]]
    return [[python, "-m", "venv", str(path)], [str(path / "bin" / "pip"), "install", "--quiet", "--no-deps", STUB_NUMPY]]


def ensure_stub_env(path: Path, run) -> Path:
    """Create the side environment once; `run(argv, step)` runs a logged subprocess (StageRecorder.run)."""
    if stub_env_ready(path):
        return path
    for index, argv in enumerate(creation_steps(path)):
        run(argv, f"stub-env-{index + 1}")
    purelib = Path(sysconfig.get_paths()["purelib"]).resolve()
    site = next(path.glob("lib/python*/site-packages"))
    lines = [f"import site; site.addsitedir({str(purelib)!r})"]
    if numpy1_site() is not None:
        lines.insert(0, f"import site; site.addsitedir({str(numpy1_site())!r})")
    # Lines starting with `import` run at start-up, after the environment's own site-packages (numpy 1, if
    # installed there) and in this order, so numpy 1 is found before the project venv's numpy 2.
    (site / PTH_NAME).write_text("\n".join(lines) + "\n")
    return path
