"""`plan --measure-host`: this machine's memory bandwidth and matrix throughput, stored as the `cpu` entry."""

from __future__ import annotations

import functools
import os
import platform
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

from trtllm_forge.atomic_files import write_json_atomic
from trtllm_forge.hardware import hardware_table, host_profile_path

COPY_BYTES = 256 * 1024**2  # well beyond any last-level cache
MATMUL_SIZES = (512, 1024)
BUDGET_S = 1.5  # per measurement


def total_memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _best_time(run: Callable[[], object], budget_s: float, min_repeats: int = 3) -> float:
    best, start, repeats = float("inf"), time.perf_counter(), 0
    while repeats < min_repeats or time.perf_counter() - start < budget_s:
        t0 = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - t0)
        repeats += 1
    return best


def measure_bandwidth(threads: int, budget_s: float = BUDGET_S) -> float:
    """Bytes/s of a large array copy split across threads (numpy releases the GIL while copying)."""
    import numpy as np

    chunk = COPY_BYTES // threads // 4
    sources = [np.ones(chunk, dtype=np.float32) for _ in range(threads)]
    targets = [np.empty_like(a) for a in sources]
    with ThreadPoolExecutor(threads) as pool:

        def copy_all() -> None:
            list(pool.map(lambda i: np.copyto(targets[i], sources[i]), range(threads)))

        copy_all()  # fault the pages in
        seconds = _best_time(copy_all, budget_s)
    return 2 * COPY_BYTES / seconds  # every byte is read once and written once


def measure_matmul(budget_s: float = BUDGET_S) -> float:
    """FLOP/s of float32 matrix products (the BLAS numpy links uses all cores); the best of a few sizes,
    because on a shared machine the larger products are the first to be slowed by neighbours."""
    import numpy as np

    rng = np.random.default_rng(0)
    best = 0.0
    for n in MATMUL_SIZES:
        a = rng.standard_normal((n, n), dtype=np.float32)
        b = rng.standard_normal((n, n), dtype=np.float32)
        out = np.empty_like(a)
        np.matmul(a, b, out=out)
        best = max(best, 2 * n**3 / _best_time(functools.partial(np.matmul, a, b, out=out), budget_s / len(MATMUL_SIZES)))
    return best


def measure_host(budget_s: float = BUDGET_S) -> dict:
    import numpy as np

    threads = os.cpu_count() or 1
    bandwidth = measure_bandwidth(threads, budget_s)
    flops = measure_matmul(budget_s)
    return {
        "memory_gb": round(total_memory_bytes() / 1024**3, 2),  # binary, like the GPU entries
        "bandwidth_gb_s": round(bandwidth / 1e9, 2),
        "fp32_tflops": round(flops / 1e12, 4),
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "source": f"measured by `trtllm-forge plan --measure-host` on {platform.node()} "
        f"({threads} threads, numpy {np.__version__}: {COPY_BYTES >> 20} MiB copy, best of {'/'.join(map(str, MATMUL_SIZES))}-square fp32 matmuls)",
    }


def store_host_profile(profile: dict, path: Path | None = None) -> Path:
    """Write the measured entry atomically and make the hardware table pick it up."""
    path = path or host_profile_path()
    write_json_atomic(path, profile)
    hardware_table.cache_clear()
    return path
