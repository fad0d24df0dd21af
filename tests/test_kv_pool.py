"""kv_pool: the CPU engines commit their KV cache pool at load (model_repo_templates/cpu/tensorrt_llm/kv_pool.py).

Checked against the kernel itself: mincore(2) says which pages of a region are resident."""

from __future__ import annotations

import ctypes
import mmap

import pytest
from trtllm_forge.model_repo_templates.cpu.tensorrt_llm import kv_pool

PAGE = mmap.PAGESIZE


def resident_pages(address: int, length: int) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    pages = (length + PAGE - 1) // PAGE
    vector = ctypes.create_string_buffer(pages)
    assert libc.mincore(address, length, vector) == 0, ctypes.get_errno()
    return sum(byte & 1 for byte in vector.raw)


@pytest.fixture
def fresh_region():
    """An anonymous private mapping nobody has touched: (mapping, address, length)."""
    before = kv_pool.writable_anonymous_regions()
    length = 64 * PAGE + kv_pool.MIN_REGION_BYTES
    mapping = mmap.mmap(-1, length, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    address = ctypes.addressof(ctypes.c_char.from_buffer(mapping))
    yield mapping, address, length, kv_pool.writable_anonymous_regions() - before
    mapping.close()


def test_a_new_anonymous_mapping_is_found_and_committed_with_its_contents_kept(fresh_region):
    mapping, address, length, new_regions = fresh_region
    assert any(start <= address and address + length <= end for start, end in new_regions)
    mapping[PAGE : PAGE + 5] = b"kept!"  # one page written by its owner before the commit
    assert resident_pages(address, length) == 1

    committed, problem = kv_pool.commit(new_regions)

    assert problem is None
    assert committed >= length
    assert resident_pages(address, length) == length // PAGE
    assert mapping[PAGE : PAGE + 5] == b"kept!" and mapping[0:4] == b"\0\0\0\0"


def test_regions_below_the_minimum_are_left_alone(fresh_region):
    _mapping, address, length, _ = fresh_region
    small = (address, address + kv_pool.MIN_REGION_BYTES - PAGE)
    assert kv_pool.commit({small}) == (0, None)
    assert resident_pages(address, length) == 0


def test_a_failed_madvise_is_reported_not_raised():
    unmapped = (PAGE, PAGE + kv_pool.MIN_REGION_BYTES)  # page 1 of the address space is never mapped
    committed, problem = kv_pool.commit({unmapped})
    assert committed == 0 and problem is not None and "MADV_POPULATE_WRITE" in problem


def test_what_would_crowd_the_host_is_not_committed(fresh_region, monkeypatch):
    """The pool is committed only while at most half of what the host (or the cgroup) has available: a smaller
    host keeps filling the pool page by page instead of failing at load."""
    _mapping, address, length, new_regions = fresh_region
    monkeypatch.setattr(kv_pool, "available_bytes", lambda: length)  # everything else on the host took the rest
    committed, problem = kv_pool.commit(new_regions)
    assert committed == 0 and problem is not None and problem.startswith("not committed:")
    assert resident_pages(address, length) == 0


def test_available_memory_is_read_from_the_host():
    with open("/proc/meminfo") as meminfo:
        host = next(int(line.split()[1]) * 1024 for line in meminfo if line.startswith("MemTotal:"))
    available = kv_pool.available_bytes()
    assert available is not None and 0 < available <= host
