"""Run once inside the CPU image's build (docker/Containerfile.cpu): make the nvidia-pytriton wheel's server a
plain `tritonserver` on PATH.

The wheel's server needs its bundled libraries on LD_LIBRARY_PATH and a backend directory holding the python
backend and the stub for this Python (deploy/discovery.py). Here the backend directory is Triton's default,
/opt/tritonserver/backends, and `/usr/local/bin/tritonserver` is a wrapper that sets the environment the host's
deploy sets (`server_environment`) and execs the binary. So the image runs the same command line the docker and
Kubernetes renderings write (`tritonserver --model-repository=...`, deploy/targets.py) and needs no flag of its own.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from trtllm_forge.deploy.discovery import prepare_backend_dir, pytriton_install, server_environment

DEFAULT_BACKENDS = Path("/opt/tritonserver/backends")  # tritonserver's default --backend-directory
WRAPPER = Path("/usr/local/bin/tritonserver")


def wrapper_script(binary: Path, library_path: str) -> str:
    """The wrapper: the wheel's libraries before any LD_LIBRARY_PATH the container is given, then the binary.
    (PATH is the image's: its venv first, which the stub's embedded Python needs.)"""
    return (
        "#!/bin/sh\n# Written by trtllm_forge.containers.image_setup\n"
        f'export LD_LIBRARY_PATH={shlex.quote(library_path)}"${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}"\n'
        f'exec {shlex.quote(str(binary))} "$@"\n'
    )


def main() -> int:
    install = pytriton_install()
    if install is None:
        print("nvidia-pytriton (with its tritonserver) is not installed in this image", file=sys.stderr)
        return 1
    prepare_backend_dir(install, DEFAULT_BACKENDS)
    WRAPPER.write_text(wrapper_script(install.binary, server_environment(install, base={})["LD_LIBRARY_PATH"]))
    WRAPPER.chmod(0o755)
    print(f"{WRAPPER} -> {install.binary}; python backend in {DEFAULT_BACKENDS / 'python'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
