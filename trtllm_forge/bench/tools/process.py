"""Running a tool: one process in its own process group with its output in a log, and finding a tool installed
in its own venv."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
from pathlib import Path

from trtllm_forge.errors import StepError
from trtllm_forge.processes import spawn_in_session
from trtllm_forge.ui import info


def installed(tool: str, env_var: str) -> str:
    """The executable of a tool installed in its own venv: $`env_var`, else `tool` on PATH."""
    path = os.environ.get(env_var) or shutil.which(tool)
    if not path:
        raise StepError(tool, f"{tool} is not installed", f"install it in its own venv and set {env_var}=/path/to/{tool} (see README)")
    return path


def run_logged(argv: list[str], env: dict[str, str], log: Path, timeout_s: float) -> None:
    """Run one tool process in its own process group with its output in `log`; StepError if it fails."""
    log.parent.mkdir(parents=True, exist_ok=True)
    info(f"$ {shlex.join(argv)}  (log: {log})")
    with open(log, "wb") as handle:
        handle.write(f"$ {shlex.join(argv)}\n".encode())
        handle.flush()
        process = spawn_in_session(argv, handle, env=env, cwd=log.parent)
        try:
            code = process.wait(timeout_s)
        except BaseException:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            raise
    if code != 0:
        lines = [line.strip() for line in log.read_text(errors="replace").splitlines()[1:] if line.strip()]
        said = next((line for line in lines if "error" in line.lower()), lines[-1] if lines else "no output")
        raise StepError(Path(argv[0]).name, f"exited with {code}: {said}", f"see {log}")
