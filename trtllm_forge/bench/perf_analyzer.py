"""Where perf_analyzer is, what it needs, and how `make setup` installs it.

perf_analyzer 2.51.0 (the version of our Triton) is the binary inside the `tritonclient==2.51.0` manylinux1
wheel (`tritonclient-2.51.0.data/data/bin/perf_analyzer`). Only that binary is taken from the wheel: our own
client stays the tritonclient the project pins (the binary does not use the Python package). It is linked
against `libb64.so.0d` (Debian package `libb64-0d`) and `libcudart.so.12` (PyPI `nvidia-cuda-runtime-cu12`;
loaded, no GPU used), so it runs with LD_LIBRARY_PATH set to that package's lib directory.

Install layout (inside the venv, `sys.prefix`):
  <prefix>/libexec/perf_analyzer-2.51.0/perf_analyzer   the binary
  <prefix>/bin/perf_analyzer                            a wrapper that sets LD_LIBRARY_PATH (for GenAI-Perf)

    python -m trtllm_forge.bench.perf_analyzer install   # what `make setup` runs
    python -m trtllm_forge.bench.perf_analyzer check     # exit 0 and the version, or the problem
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from trtllm_forge import third_party_env

PERF_ANALYZER_VERSION = "2.51.0"
WHEEL_REQUIREMENT = f"tritonclient=={PERF_ANALYZER_VERSION}"
WHEEL_MEMBER = f"tritonclient-{PERF_ANALYZER_VERSION}.data/data/bin/perf_analyzer"
ENV_OVERRIDE = "FORGE_PERF_ANALYZER"  # path of a perf_analyzer binary to use instead
DEBIAN_PACKAGE = "libb64-0d"


def install_dir(prefix: Path | None = None) -> Path:
    return Path(prefix or sys.prefix) / "libexec" / f"perf_analyzer-{PERF_ANALYZER_VERSION}"


def cudart_lib_dir() -> Path | None:
    """The lib directory of the `nvidia-cuda-runtime-cu12` package (holds libcudart.so.12), if installed."""
    spec = importlib.util.find_spec("nvidia.cuda_runtime")
    for location in (spec.submodule_search_locations or []) if spec else []:
        lib = Path(location) / "lib"
        if (lib / "libcudart.so.12").is_file():
            return lib
    return None


@dataclass
class PerfAnalyzer:
    binary: Path
    lib_dirs: list[Path] = field(default_factory=list)

    def env(self, base: dict | None = None) -> dict:
        """The environment to run the binary in (the user's: trtllm_forge.third_party_env): LD_LIBRARY_PATH gains the
        libcudart directory."""
        env = third_party_env(base)
        dirs = [str(d) for d in self.lib_dirs] + ([env["LD_LIBRARY_PATH"]] if env.get("LD_LIBRARY_PATH") else [])
        if dirs:
            env["LD_LIBRARY_PATH"] = os.pathsep.join(dirs)
        return env

    def missing_libraries(self) -> list[str]:
        """Shared libraries the dynamic loader cannot find for the binary (from `ldd`), e.g. libb64.so.0d."""
        try:
            out = subprocess.run(["ldd", str(self.binary)], capture_output=True, text=True, env=self.env(), timeout=30).stdout
        except (OSError, subprocess.TimeoutExpired):
            return []
        return [line.split("=>")[0].strip() for line in out.splitlines() if "not found" in line]

    def version(self) -> str | None:
        """`perf_analyzer --version` ("2.51.0"), or None when it does not run."""
        try:
            proc = subprocess.run([str(self.binary), "--version"], capture_output=True, text=True, env=self.env(), timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None
        words = (proc.stdout + " " + proc.stderr).split()  # 2.51 prints it on stderr
        if proc.returncode != 0 or "Version" not in words:
            return None
        return words[words.index("Version") + 1]


def find_perf_analyzer() -> PerfAnalyzer | None:
    """The perf_analyzer to run: $FORGE_PERF_ANALYZER, else the one `make setup` installed in this venv, else
    `perf_analyzer` on PATH. None when there is none (check `missing_libraries()`/`version()` before trusting it)."""
    override = os.environ.get(ENV_OVERRIDE)
    candidates = [Path(override)] if override else []
    candidates.append(install_dir() / "perf_analyzer")
    on_path = shutil.which("perf_analyzer")
    if on_path:
        candidates.append(Path(on_path))
    lib = cudart_lib_dir()
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return PerfAnalyzer(candidate, [lib] if lib else [])
    return None


def problem() -> str | None:
    """One line saying why perf_analyzer cannot run here, or None when it can (for `doctor` and tests)."""
    found = find_perf_analyzer()
    if found is None:
        return (
            f"perf_analyzer {PERF_ANALYZER_VERSION} is not installed: run `make setup` (python -m trtllm_forge.bench.perf_analyzer install)"
        )
    missing = found.missing_libraries()
    if missing:
        hints = {
            "libb64.so.0d": f"apt-get install {DEBIAN_PACKAGE} (make system-deps)",
            "libcudart.so.12": "pip install nvidia-cuda-runtime-cu12",
        }
        return f"{found.binary} cannot load {', '.join(missing)}: " + "; ".join(hints.get(m, m) for m in missing)
    if found.version() is None:
        return f"{found.binary} does not run (`{found.binary} --version` failed)"
    return None


_WRAPPER = """#!/bin/sh
# perf_analyzer {version} from the tritonclient wheel, with the libcudart it loads (written by trtllm-forge).
LD_LIBRARY_PATH="{lib}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}" exec "{binary}" "$@"
"""


def install(prefix: Path | None = None, wheel: Path | None = None) -> Path:
    """Extract perf_analyzer from the tritonclient 2.51.0 wheel (downloaded with pip unless given) into
    `install_dir(prefix)` and write the `bin/perf_analyzer` wrapper; return the binary's path."""
    target = install_dir(prefix)
    binary = target / "perf_analyzer"
    if not binary.is_file():
        with tempfile.TemporaryDirectory() as tmp:
            if wheel is None:
                subprocess.run(
                    [
                        sys.executable,
                        "-m",
                        "pip",
                        "download",
                        "--quiet",
                        "--no-deps",
                        "--only-binary=:all:",
                        "--platform",
                        "manylinux1_x86_64",
                        "--python-version",
                        "3",
                        "-d",
                        tmp,
                        WHEEL_REQUIREMENT,
                    ],
                    check=True,
                )
                wheel = next(Path(tmp).glob("tritonclient-*.whl"))
            target.mkdir(parents=True, exist_ok=True)
            partial = target / "perf_analyzer.partial"
            with zipfile.ZipFile(wheel) as archive, archive.open(WHEEL_MEMBER) as src, open(partial, "wb") as dst:
                shutil.copyfileobj(src, dst)
            partial.chmod(0o755)
            os.replace(partial, binary)
    lib = cudart_lib_dir()
    wrapper = Path(prefix or sys.prefix) / "bin" / "perf_analyzer"
    wrapper.write_text(_WRAPPER.format(version=PERF_ANALYZER_VERSION, lib=lib or "", binary=binary))
    wrapper.chmod(0o755)
    return binary


def main(argv: list[str]) -> int:
    command = argv[0] if argv else "check"
    if command == "install":
        binary = install()
        print(f"perf_analyzer {PERF_ANALYZER_VERSION}: {binary}")
    why = problem()
    if why:
        print(why, file=sys.stderr)
        return 0 if command == "install" else 1  # installed; a missing system library is make system-deps' job
    found = find_perf_analyzer()
    assert found is not None  # problem() is None only for a perf_analyzer it found
    print(f"perf_analyzer {found.version()} at {found.binary} (LD_LIBRARY_PATH += {', '.join(map(str, found.lib_dirs)) or '-'})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
