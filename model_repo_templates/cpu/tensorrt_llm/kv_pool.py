"""Commit an OpenVINO GenAI pipeline's paged KV cache at load, as TensorRT-LLM's pool is on a GPU and llama.cpp's is
on a CPU (llama-server clears its whole KV buffer when it creates it: ggml-org/llama.cpp src/llama-kv-cache.cpp,
`ggml_backend_buffer_clear(buf, 0)` after allocating).

GenAI allocates the pool (num_kv_blocks blocks) at its first scheduled step, as untouched anonymous memory: every
page costs a page fault the first time a block on it is written. A serving engine keeps writing fresh pages until it
has used each block once (measured: a 40-block pool stopped faulting after its first wave of requests, the 1024-block
default kept faulting), and the decode step that opens a new block for every running sequence (all prompts crossing a
32-token boundary together) pays their faults inside one step: in process, 8 sequences after 64-token prompts, those
steps (decode steps 0 and 32 of every wave) took 35-52 ms against a 24-29 ms median on this project's 2-core VM, and
with the pool committed they stopped standing out (README, "The KV cache pool is committed at load").

`warm_up_and_commit` runs a full batch of one-token requests through the pipeline (GenAI allocates the pool, and the
first prefill and decode steps' one-time work is done before the first client's request), then asks the kernel to
fault in every writable anonymous region that appeared meanwhile (madvise MADV_POPULATE_WRITE: pages become present and writable, contents unchanged).

Standard library plus what the callers already import (numpy, openvino): copied beside model.py by render
(render/templates.py, CPU_ENGINE_SIBLINGS) and imported by the LLM-API stand-in (trtllm_forge/llmapi_cpu/llm.py).
"""

from __future__ import annotations

import ctypes
import time
from typing import Any

MADV_POPULATE_WRITE = 23  # <linux/mman.h>, Linux 5.14 and later
MIN_REGION_BYTES = 1 << 20  # smaller new regions are allocator bookkeeping, not the pool
RESERVE_FRACTION = 0.5  # commit only what leaves at least this share of the available memory to everything else
WARM_UP_TOKEN_ID = 0
WARM_UP_REQUEST_ID = 2**64 - 1  # and down: GenAI's ids are unsigned; the engine models count theirs from 0
WARM_UP_NEW_TOKENS = 2


def writable_anonymous_regions() -> set[tuple[int, int]]:
    """(start, end) of this process's private writable mappings that have no file behind them (/proc/self/maps)."""
    regions = set()
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                fields = line.split()
                if len(fields) == 5 and fields[1].startswith("rw") and fields[1].endswith("p"):
                    start, end = (int(value, 16) for value in fields[0].split("-"))
                    regions.add((start, end))
    except OSError:
        return set()
    return regions


def _read_int(path: str) -> int | None:
    try:
        with open(path) as handle:
            text = handle.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max": no limit


def available_bytes() -> int | None:
    """Memory this process may still take: the host's MemAvailable, or less under its cgroup's limit (v2 or v1)."""
    available = None
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    available = int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        with open("/proc/self/cgroup") as cgroups:
            lines = cgroups.read().splitlines()
    except OSError:
        lines = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            limit, usage = _read_int(f"/sys/fs/cgroup{path}/memory.max"), _read_int(f"/sys/fs/cgroup{path}/memory.current")
        elif "memory" in controllers.split(","):
            base = f"/sys/fs/cgroup/memory{path}"
            limit, usage = _read_int(f"{base}/memory.limit_in_bytes"), _read_int(f"{base}/memory.usage_in_bytes")
        else:
            continue
        if limit is not None and usage is not None and limit < 1 << 60:  # v1 writes ~2**63 for "no limit"
            available = min(available, limit - usage) if available is not None else limit - usage
    return available


def commit(regions: set[tuple[int, int]]) -> tuple[int, str | None]:
    """Fault in every region of at least MIN_REGION_BYTES: (bytes committed, why not all or None). Nothing is
    committed when it would leave less than RESERVE_FRACTION of what was available (the pool then fills page by
    page as it is used, as without this module)."""
    large = sorted((start, end) for start, end in regions if end - start >= MIN_REGION_BYTES)
    wanted = sum(end - start for start, end in large)
    available = available_bytes()
    if available is not None and wanted > available * (1 - RESERVE_FRACTION):
        return 0, (
            f"not committed: {wanted / 2**20:.0f} MiB would leave less than {RESERVE_FRACTION:.0%} of the "
            f"{available / 2**20:.0f} MiB available"
        )
    try:
        madvise = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError) as exc:
        return 0, f"no madvise: {exc}"
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    committed = 0
    for start, end in large:
        if madvise(start, end - start, MADV_POPULATE_WRITE) != 0:
            errno = ctypes.get_errno()
            # EINVAL: a kernel before 5.14; the pool then fills page by page as before.
            return committed, f"madvise(MADV_POPULATE_WRITE) failed: errno {errno}"
        committed += end - start
    return committed, None


def warm_up_and_commit(pipeline: Any, ov_genai: Any, sequences: int = 1, num_assistant_tokens: int = 0) -> str:
    """Run `sequences` one-token requests of WARM_UP_NEW_TOKENS each to their end (one prefill and one decode step at
    that batch size, so their one-time work is done before the first client's request: a first batch-8 decode step
    took 79 ms after a one-request warm-up and 45 ms after a 16-request one, later ones 41-51), then commit the memory
    they made GenAI allocate. Returns a log line. A pipeline with a draft model takes only requests that draft: pass
    its num_assistant_tokens."""
    import numpy as np
    import openvino as ov

    before = writable_anonymous_regions()
    started = time.monotonic()
    config = ov_genai.GenerationConfig()
    config.max_new_tokens = WARM_UP_NEW_TOKENS
    if num_assistant_tokens:
        config.num_assistant_tokens = num_assistant_tokens
    prompt = ov.Tensor(np.asarray([[WARM_UP_TOKEN_ID]], dtype=np.int64))
    sequences = max(1, sequences)
    # Keep the handles: GenAI drops a request whose handle is gone.
    handles = [pipeline.add_request(WARM_UP_REQUEST_ID - k, prompt, config) for k in range(sequences)]
    while pipeline.has_non_finished_requests():
        pipeline.step()
    del handles
    warmed = time.monotonic()
    committed, problem = commit(writable_anonymous_regions() - before)
    line = (
        f"warm-up of {sequences} requests {(warmed - started) * 1000:.0f} ms; committed {committed / 2**20:.0f} "
        f"MiB of new engine memory (the KV cache pool) in {time.monotonic() - warmed:.2f}s"
    )
    return f"{line}; {problem}" if problem else line
