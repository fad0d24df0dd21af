"""The hardware table shipped with the package (data/hardware.json).

The `cpu` entry is a placeholder until `trtllm-forge plan --measure-host` stores this machine's measured
numbers in a user-writable file (`host_profile_path()`); from then on the table returns the measured entry.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, fields
from functools import lru_cache
from importlib import resources
from pathlib import Path

from trtllm_forge.user_cache import user_cache_dir

HOST_PROFILE_ENV = "TRTLLM_FORGE_CPU_PROFILE"


@dataclass(frozen=True)
class Device:
    name: str
    memory_gb: float
    bandwidth_gb_s: float | None
    fp16_tflops: float | None
    fp8_tflops: float | None
    fp4_tflops: float | None
    int8_tops: float | None
    compute_capability: float | None
    nvlink_gb_s: float | None
    source: str
    # Only measured CPU entries carry these: CPUs run the unquantized model in fp32.
    fp32_tflops: float | None = None
    measured_at: str | None = None

    @property
    def is_gpu(self) -> bool:
        return self.compute_capability is not None

    @property
    def link_kind(self) -> str:
        """The link between this device's tensor-parallel ranks: a key of the table's `links`."""
        return "nvlink" if self.nvlink_gb_s else "pcie"


@dataclass(frozen=True)
class Link:
    """Latency and bandwidth of a link kind between GPUs of one node (data/hardware.json `links`, with sources)."""

    kind: str
    call_latency_us: float  # once per collective call
    hop_latency_us: float  # per ring step
    bandwidth_gb_s: float | None  # per direction; None: the device's own figure (NVLink)
    source: str


def host_profile_path() -> Path:
    """Where `plan --measure-host` keeps the measured cpu entry (overridable for tests)."""
    override = os.environ.get(HOST_PROFILE_ENV)
    if override:
        return Path(override).expanduser()
    return user_cache_dir() / "hardware-cpu.json"


def _measured_cpu() -> dict | None:
    path = host_profile_path()
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    known = {f.name for f in fields(Device)} - {"name"}
    return {k: v for k, v in raw.items() if k in known} if isinstance(raw, dict) else None


def _shipped_table() -> dict:
    table: dict = json.loads(resources.files("trtllm_forge").joinpath("data/hardware.json").read_text())
    return table


@lru_cache(maxsize=1)
def link_table() -> dict[str, Link]:
    links = _shipped_table()["links"]
    return {kind: Link(kind=kind, **entry) for kind, entry in links.items() if kind != "note"}


@lru_cache(maxsize=1)
def hardware_table() -> dict[str, Device]:
    devices = _shipped_table()["devices"]
    measured = _measured_cpu()
    if measured:
        devices = {**devices, "cpu": {**devices["cpu"], **measured}}
    return {name: Device(name=name, **entry) for name, entry in devices.items()}


def find_device(name: str) -> Device | None:
    """Look a device up by name, ignoring case, spaces and dashes."""

    def key(text: str) -> str:
        return text.lower().replace(" ", "").replace("-", "").replace("_", "")

    return next((dev for dev in hardware_table().values() if key(dev.name) == key(name)), None)
