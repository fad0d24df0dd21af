"""Where and when a committed result was measured: the git commit of the tree that produced it and the machine
(CPU model, cores, load). Benchmark scripts store this beside their numbers so the README can name both."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


# Pathspecs git status leaves out of the dirty check: what benchmark runs write (results, the generated docs), not code they run.
UNMEASURED_PATHS = (":(exclude)results", ":(exclude)README.md", ":(exclude)docs")


def git_commit(repo: Path = REPO) -> str:
    """HEAD of the repository, with `-dirty` when tracked files differ from it; "unknown" outside git. Result
    files (`results/`, the README the tables are generated into) do not count: one benchmark's fresh result must not
    mark the next benchmark of the same session as measured on changed code."""
    try:
        commit = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no", "--", ".", *UNMEASURED_PATHS],
            capture_output=True,
            text=True,
        ).stdout.strip()
        return commit + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def cpu_model() -> str:
    """The CPU's marketing name from /proc/cpuinfo (Linux), else what platform reports."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def usable_cores() -> int:
    """Cores this process may run on (its affinity mask; a container may see fewer than the host has)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


# /proc/stat's aggregate `cpu` line: user nice system idle iowait irq softirq steal (guest time is inside user/nice)
_STEAL_FIELD, _TIME_FIELDS = 7, 8


def machine_cpu_ticks() -> tuple[int, ...] | None:
    """The machine's CPU time so far by kind, in clock ticks (the first eight fields of /proc/stat's `cpu` line);
    None where there is no /proc/stat."""
    try:
        with open("/proc/stat", encoding="ascii") as handle:
            fields = handle.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu" or len(fields) <= _TIME_FIELDS:
        return None
    return tuple(int(x) for x in fields[1 : 1 + _TIME_FIELDS])


def steal_share(before: tuple[int, ...] | None, after: tuple[int, ...] | None) -> float | None:
    """The share of the machine's CPU time between two readings that the hypervisor gave to other guests (steal
    time): while it is high, everything on this machine runs slower than the machine can."""
    if before is None or after is None:
        return None
    elapsed = sum(after) - sum(before)
    return (after[_STEAL_FIELD] - before[_STEAL_FIELD]) / elapsed if elapsed > 0 else None


def machine() -> dict[str, Any]:
    return {
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "cpu_model": cpu_model(),
        "cpus": os.cpu_count(),
        "usable_cores": usable_cores(),
        "load_average": list(os.getloadavg()),
    }


def utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


RESULTS = REPO / "results"


def memory_bandwidth_gb_s(budget_s: float = 1.0) -> float:
    """This machine's copy bandwidth now, measured the way `plan --measure-host` measures it (all cores)."""
    from trtllm_forge.plan.host import measure_bandwidth

    return round(measure_bandwidth(os.cpu_count() or 1, budget_s) / 1e9, 2)


def record(measure_bandwidth: bool = True) -> dict[str, Any]:
    """What every committed result starts with: the commit (and whether the tree differed from it), the
    machine with its load average and, when asked, its memory bandwidth measured at the start of the run.
    The machine is shared: the load average says how noisy the numbers are."""
    commit = git_commit()
    found = machine()
    if measure_bandwidth:
        found["bandwidth_gb_s"] = memory_bandwidth_gb_s()
    return {
        "git_commit": commit.removesuffix("-dirty"),
        "git_dirty": commit.endswith("-dirty"),
        "machine": found,
        "started_utc": utc_now(),
    }


def finish(document: dict[str, Any]) -> dict[str, Any]:
    """Stamp the end of a run (time and load average) onto a document `record` started."""
    document["finished_utc"] = utc_now()
    document["machine"]["load_average_end"] = list(os.getloadavg())
    return document


def write_result(path: Path, document: dict[str, Any]) -> Path:
    """Write a result file atomically (a reader never sees half a file), creating its folder."""
    from trtllm_forge.stages import write_json_atomic

    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, document)
    return path


def measured_where(document: dict[str, Any]) -> str:
    """One line for a README block: the commit (and a dirty tree), when, the machine, its load (and bandwidth when
    measured) and the run's note, from a result file `record` started."""
    commit = str(document.get("git_commit", "unknown"))
    dirty = document.get("git_dirty", commit.endswith("-dirty"))
    found = document.get("machine", {})
    cores = f"{found['usable_cores']} cores" if "usable_cores" in found else f"{found.get('cpus', '?')} CPUs"
    parts = [f"git {commit.removesuffix('-dirty')[:12]}{' (dirty tree)' if dirty else ''}", str(document.get("started_utc", "?"))]
    parts += [str(found["cpu_model"])] if "cpu_model" in found else []
    parts.append(cores)
    if "bandwidth_gb_s" in found:
        parts.append(f"{found['bandwidth_gb_s']} GB/s measured at the start")
    load = f"load average {found['load_average'][0]:.1f} at the start" if found.get("load_average") else "load average unknown"
    if found.get("load_average_end"):
        load += f" and {found['load_average_end'][0]:.1f} at the end"
    parts.append(load)
    return ", ".join(parts) + (f"; note: {document['note']}" if document.get("note") else "")
