"""The hardware table shipped with the package (data/hardware.json)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources


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

    @property
    def is_gpu(self) -> bool:
        return self.compute_capability is not None


@lru_cache(maxsize=1)
def hardware_table() -> dict[str, Device]:
    raw = json.loads(resources.files("trtllm_forge").joinpath("data/hardware.json").read_text())
    return {name: Device(name=name, **fields) for name, fields in raw["devices"].items()}


def find_device(name: str) -> Device | None:
    """Look a device up by name, ignoring case, spaces and dashes."""
    def key(text: str) -> str:
        return text.lower().replace(" ", "").replace("-", "").replace("_", "")

    return next((dev for dev in hardware_table().values() if key(dev.name) == key(name)), None)
