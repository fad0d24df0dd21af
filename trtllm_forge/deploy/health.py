"""Are the python-backend stubs of a running Triton server alive?

Triton runs every instance of a python-backend model in its own stub process, in the server's process
group (deploy starts the server in a session of its own; under mpirun too).
When a stub dies (a crash, the OOM killer, a SIGKILL), Triton 2.51 keeps answering ready for that model
and for the whole server, while requests to it fail or hang and requests in flight from it can wedge the
models it called. So readiness is not enough: a deployment is healthy only when every python instance the
repository configures has a live stub. Reading /proc is cheap and never waits on the possibly wedged server.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from trtllm_forge.deploy.discovery import STUB
from trtllm_forge.processes import all_pids, cmdline, proc_stat

STUB_COMM = STUB[:15]  # /proc/<pid>/comm keeps 15 characters; a dead (zombie) stub has no cmdline


@dataclass
class StubHealth:
    expected: dict[str, int]  # model -> python instances its config.pbtxt asks for
    alive: dict[str, int] = field(default_factory=dict)  # model -> live stub processes
    dead: int = 0  # stub children of the server that exited (zombies the server has not reaped)

    @property
    def missing(self) -> dict[str, int]:
        """Models with fewer live stubs than configured instances -> how many are missing."""
        return {m: n - self.alive.get(m, 0) for m, n in self.expected.items() if self.alive.get(m, 0) < n}

    @property
    def healthy(self) -> bool:
        return not self.missing and not self.dead

    def problems(self) -> list[str]:
        found = [f"model {m}: {n} of {self.expected[m]} python stub process(es) not running" for m, n in sorted(self.missing.items())]
        if self.dead:
            found.append(f"{self.dead} python stub process(es) of the server exited")
        return found


def python_instances(repository: Path) -> dict[str, int]:
    """Model name -> number of python-backend instances, from each config.pbtxt of the repository."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    counts: dict[str, int] = {}
    for config_path in sorted(Path(repository).glob("*/config.pbtxt")):
        config = model_config_pb2.ModelConfig()
        try:
            text_format.Parse(config_path.read_text(errors="replace"), config)
        except text_format.ParseError:
            continue  # Triton would not have loaded it; render --check reports it
        if config.backend != "python":
            continue
        groups = list(config.instance_group)
        counts[config_path.parent.name] = sum(g.count or 1 for g in groups) if groups else 1
    return counts


def stub_processes(pgid: int) -> tuple[dict[str, int], int]:
    """(model -> live stubs, number of exited stubs) in process group `pgid`."""
    alive, dead = stub_pids(pgid)
    return {model: len(pids) for model, pids in alive.items()}, dead


def stub_pids(pgid: int) -> tuple[dict[str, list[int]], int]:
    """(model -> pids of its live stubs, number of exited stubs) in process group `pgid`.

    A stub's argv is `triton_python_backend_stub <repo>/<model>/<version>/model.py <shm region> ...`.
    """
    alive: dict[str, list[int]] = {}
    dead = 0
    for pid in all_pids():
        stat = proc_stat(pid)
        if stat is None or stat[2] != pgid:
            continue
        try:
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue
        if comm != STUB_COMM:
            continue
        argv = cmdline(pid)
        if stat[0] in ("Z", "X") or not argv:
            dead += 1
        elif len(argv) > 1:
            alive.setdefault(Path(argv[1]).parent.parent.name, []).append(pid)
    return alive, dead


def stub_health(pgid: int | None, repository: Path) -> StubHealth:
    """Stub processes of the server whose process group is `pgid` against what `repository` configures
    (nothing is expected when the group is unknown or /proc is missing: no false alarm)."""
    if not pgid or not Path("/proc").is_dir():
        return StubHealth(expected={})
    alive, dead = stub_processes(pgid)
    return StubHealth(expected=python_instances(repository), alive=alive, dead=dead)
