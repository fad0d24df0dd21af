"""The container runtime on this machine (podman, else docker) and how every command to it is run and logged.

podman needs no daemon and is what Debian ships; docker is used only when podman is absent. On the project's
machines podman needs a containers.conf (passed with CONTAINERS_CONF, nothing under /etc is changed): the default
crun refuses their hybrid cgroup layout, so runc is named, and root lacks CAP_SYS_RESOURCE, so the default
container ulimits (above the hard limits) fail; they are set to this process's own hard limits. A CONTAINERS_CONF
the user set is kept as it is.
"""

from __future__ import annotations

import os
import resource
import shlex
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from trtllm_forge import third_party_env
from trtllm_forge.errors import StepError
from trtllm_forge.user_cache import user_cache_dir

# What CI and the Makefile's system-deps install (Debian bookworm: podman 4.3, runc 1.1, mmdebstrap 1.3).
INSTALL_COMMAND = "apt-get install -y podman runc mmdebstrap"
INSTALL_HINT = f"install a container runtime as root: `{INSTALL_COMMAND}` (or `sudo make system-deps`)"
# conmon runs its containers with at most this many processes; a higher nproc soft limit is refused.
CONMON_NPROC = 32768


@dataclass(frozen=True)
class ContainerRuntime:
    """The runtime binary and the environment every call to it gets (CONTAINERS_CONF for podman)."""

    name: str  # "podman" | "docker"
    binary: Path
    env: dict[str, str] = field(default_factory=dict)

    def argv(self, *args: str) -> list[str]:
        return [str(self.binary), *args]

    def environment(self) -> dict[str, str]:
        return {**third_party_env(), **self.env}

    def run(self, args: list[str], log: Path, *, check: bool = True, timeout_s: float = 600.0) -> subprocess.CompletedProcess[str]:
        """`<runtime> args...`, its argv and output appended to `log`; a failure (when `check`) is a StepError."""
        return run_logged(self.argv(*args), log, env=self.environment(), check=check, timeout_s=timeout_s)


def run_logged(
    argv: list[str], log: Path, *, env: dict[str, str] | None = None, check: bool = True, timeout_s: float = 600.0
) -> subprocess.CompletedProcess[str]:
    """Run `argv` (never through a shell), append the command line, its output and its exit code to `log`."""
    log.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        with log.open("a") as out:
            out.write(f"$ {shlex.join(argv)}\n(timed out after {timeout_s:.0f} s)\n")
        raise StepError("container", f"`{shlex.join(argv[:3])} ...` did not finish within {timeout_s:.0f} s", f"see {log}") from None
    with log.open("a") as out:
        out.write(f"$ {shlex.join(argv)}\n{proc.stdout}{proc.stderr}(exit {proc.returncode}, {time.monotonic() - started:.1f} s)\n")
    if check and proc.returncode != 0:
        last = (proc.stderr.strip() or proc.stdout.strip()).splitlines()[-1:] or ["(no output)"]
        raise StepError(
            "container", f"`{shlex.join(argv[:3])} ...` failed (exit {proc.returncode}): {last[0]}", f"the whole output is in {log}"
        )
    return proc


def containers_conf_text() -> str:
    """podman's settings for this machine: runc when installed, and ulimits within this process's hard limits."""
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    nproc = resource.getrlimit(resource.RLIMIT_NPROC)[1]
    nproc = CONMON_NPROC if nproc == resource.RLIM_INFINITY else min(nproc, CONMON_NPROC)
    limits = [f"nofile={nofile}:{nofile}"] if nofile != resource.RLIM_INFINITY else []
    limits.append(f"nproc={nproc}:{nproc}")
    lines = ["[containers]", "default_ulimits = [" + ", ".join(f'"{limit}"' for limit in limits) + "]"]
    if shutil.which("runc"):
        lines += ["[engine]", 'runtime = "runc"']
    return "\n".join(lines) + "\n"


def containers_conf() -> Path:
    """The containers.conf in the user cache (rewritten when its content would change)."""
    path = user_cache_dir() / "containers" / "containers.conf"
    text = containers_conf_text()
    if not path.is_file() or path.read_text() != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(text)
        os.replace(tmp, path)
    return path


def find_runtime() -> ContainerRuntime:
    """podman (with its containers.conf), else docker; a StepError saying what to install when neither is there."""
    podman = shutil.which("podman")
    if podman:
        conf = os.environ.get("CONTAINERS_CONF") or str(containers_conf())
        return ContainerRuntime("podman", Path(podman), {"CONTAINERS_CONF": conf})
    docker = shutil.which("docker")
    if docker:
        return ContainerRuntime("docker", Path(docker))
    raise StepError("container runtime", "neither podman nor docker is installed", INSTALL_HINT)
