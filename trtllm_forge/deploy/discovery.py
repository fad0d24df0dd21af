"""Find a `tritonserver` binary and prepare what it needs to run the python backend on this machine.

Three places are searched, in order: `tritonserver` on PATH, `/opt/tritonserver/bin/tritonserver` (the NGC
image layout), and the server bundled in the `nvidia-pytriton` wheel. The wheel's server needs two things a
container install already has: its bundled shared libraries on LD_LIBRARY_PATH, and a backend directory
whose `python/` folder holds the python backend plus the stub built for the running Python version.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

from trtllm_forge.errors import StepError

OPT_TRITONSERVER = Path("/opt/tritonserver/bin/tritonserver")
STUB = "triton_python_backend_stub"
INSTALL_HINT = (
    "install Triton: `pip install --no-deps nvidia-pytriton==0.7.0` (bundles tritonserver 2.51), or put "
    "`tritonserver` on PATH, or use the NGC image (/opt/tritonserver)"
)


@dataclass(frozen=True)
class TritonInstall:
    """Where a usable server lives and what its environment needs."""

    kind: str  # "path" | "opt" | "pytriton"
    binary: Path
    library_dirs: list[Path] = field(default_factory=list)
    # For the wheel only: the files the backend directory is assembled from.
    python_backend_dir: Path | None = None
    stub: Path | None = None


def _pytriton_root() -> Path | None:
    # find_spec on a top-level name does not import the package (pytriton's __init__ is heavy).
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def python_tag() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def pytriton_install() -> TritonInstall | None:
    """The server bundled in the nvidia-pytriton wheel, or None when the wheel (or its server) is absent.
    Its stub for this Python may be missing: `find_tritonserver` refuses that, render falls back."""
    root = _pytriton_root()
    if root is None:
        return None
    server = root / "tritonserver"
    binary = server / "bin" / "tritonserver"
    if not binary.is_file():
        return None
    return TritonInstall(
        "pytriton",
        binary,
        library_dirs=[root.parent / "nvidia_pytriton.libs"],
        python_backend_dir=server / "backends" / "python",
        stub=server / "python_backend_stubs" / python_tag() / STUB,
    )


def find_tritonserver() -> TritonInstall:
    """The first usable server, or a StepError saying how to install one."""
    on_path = shutil.which("tritonserver")
    if on_path:
        return TritonInstall("path", Path(on_path))
    if OPT_TRITONSERVER.is_file() and os.access(OPT_TRITONSERVER, os.X_OK):
        return TritonInstall("opt", OPT_TRITONSERVER)
    wheel = pytriton_install()
    if wheel is not None:
        if wheel.stub is None or not wheel.stub.is_file():
            raise StepError(
                "deploy.tritonserver",
                f"the nvidia-pytriton wheel has no python backend stub for Python {python_tag()} ({wheel.stub})",
                "run trtllm-forge with a Python the wheel supports (3.8-3.13)",
            )
        return wheel
    raise StepError("deploy.tritonserver", "no tritonserver found (PATH, /opt/tritonserver, nvidia-pytriton)", INSTALL_HINT)


def backend_files(install: TritonInstall) -> dict[str, Path]:
    """Target name in `<backends>/python/` → source file, for installs that need a backend directory."""
    if install.python_backend_dir is None or install.stub is None:
        return {}
    return {
        "libtriton_python.so": install.python_backend_dir / "libtriton_python.so",
        "triton_python_backend_utils.py": install.python_backend_dir / "triton_python_backend_utils.py",
        STUB: install.stub,
    }


def prepare_backend_dir(install: TritonInstall, backends: Path) -> Path | None:
    """Assemble `<backends>/python/` (copies, refreshed when the wheel's change) for the wheel's server and
    return `backends` for `--backend-directory`; None when the install has its own backends."""
    files = backend_files(install)
    if not files:
        return None
    target = backends / "python"
    target.mkdir(parents=True, exist_ok=True)
    for name, source in files.items():
        if not source.is_file():
            raise StepError("deploy.tritonserver", f"the nvidia-pytriton wheel lacks {source}", "reinstall it: " + INSTALL_HINT)
        dest = target / name
        if dest.is_file() and dest.stat().st_size == source.stat().st_size and dest.stat().st_mtime >= source.stat().st_mtime:
            continue
        tmp = dest.with_name(f".{name}.tmp")
        shutil.copy2(source, tmp)
        os.replace(tmp, dest)
    return backends


def _numpy_major(site: Path) -> int | None:
    found = sorted(site.glob("numpy-*.dist-info"))
    if not found:
        return None
    try:
        return int(found[-1].name.split("-")[1].split(".")[0])
    except (IndexError, ValueError):
        return None


def venv_site_packages() -> Path:
    import sysconfig

    return Path(sysconfig.get_paths()["purelib"])


def check_stub_numpy(install: TritonInstall) -> None:
    """The wheel's python stub was built against NumPy 1.x; under NumPy 2 it corrupts every tensor it passes."""
    if install.kind == "pytriton" and (_numpy_major(venv_site_packages()) or 0) >= 2:
        raise StepError(
            "deploy.python_stub",
            "the nvidia-pytriton python stub needs NumPy 1.x (with NumPy 2 it corrupts string and numeric tensors)",
            f"`{sys.executable} -m pip install 'numpy>=1.26,<2'` (trtllm-forge pins it so)",
        )


def python_library_dir() -> Path | None:
    """The folder of this interpreter's libpython, so the stub (linked to libpython3.X) embeds the same Python
    whose standard library it will load, and needs no system libpython."""
    import sysconfig

    libdir, soname = sysconfig.get_config_var("LIBDIR"), sysconfig.get_config_var("INSTSONAME")
    if sysconfig.get_config_var("Py_ENABLE_SHARED") and libdir and soname and (Path(libdir) / soname).is_file():
        return Path(libdir)
    return None


def server_environment(install: TritonInstall, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment changes the server (and the python stubs it starts) needs, on top of `base`
    (default: this process's environment; `{}` gives just the additions, for a launch script to prepend).

    The stub embeds Python and finds its site-packages from the first `python3` on PATH; PYTHONPATH does not
    reach it. Putting our bin directory first makes the stubs import this venv's packages even for models
    without an EXECUTION_ENV_PATH parameter.
    """
    base = dict(os.environ if base is None else base)
    env: dict[str, str] = {}
    if install.library_dirs:
        dirs = [str(d) for d in install.library_dirs]
        libpython = python_library_dir()
        if libpython is not None:
            dirs.append(str(libpython))
        if base.get("LD_LIBRARY_PATH"):
            dirs.append(base["LD_LIBRARY_PATH"])
        env["LD_LIBRARY_PATH"] = os.pathsep.join(dirs)
    bin_dir = str(Path(sys.executable).parent)
    path = base.get("PATH", "")
    if path.split(os.pathsep)[0] != bin_dir:
        env["PATH"] = os.pathsep.join([bin_dir, path]) if path else bin_dir
    return env
