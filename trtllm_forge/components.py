"""The Python distributions `trtllm-forge version` lists and `doctor` checks: each engine's own (declared by its
descriptor, builders/engines.py) and the serving and reference stack every chain uses."""

from __future__ import annotations

from trtllm_forge.builders.descriptor import Component
from trtllm_forge.builders.engines import engine_components
from trtllm_forge.package_versions import installed_version

STACK = (
    Component("tritonclient", "verify, bench", required=True),
    Component("transformers", "import, verify (reference answers)", required=True),
    Component("torch", "import, verify (reference answers)", required=True),
    # doctor's tritonserver check finds and runs the server this distribution ships
    Component("nvidia-pytriton", "deploy (tritonserver and the python stub)", required=True, doctor_row=False),
)
COMPONENTS: tuple[Component, ...] = (*engine_components(), *STACK)


def installed_versions() -> dict[str, str | None]:
    """Each component's installed version (None when it is not installed), in COMPONENTS order."""
    return {component.distribution: installed_version(component.distribution) for component in COMPONENTS}
