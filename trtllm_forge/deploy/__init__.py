"""deploy stage: the server kinds (`deploy/kinds/`: Triton, trtllm-serve) behind one contract, Triton's local
server (start, status, stop) and the docker/kubernetes renderings.

Names are imported on first use: `config/schema.py` reads the kinds registry, and importing Triton's server module
here would import the config package while it is being imported.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "read_state": "trtllm_forge.deploy.state",
    "state_path": "trtllm_forge.deploy.state",
    "TritonDeployment": "trtllm_forge.deploy.state",
    "serving": "trtllm_forge.deploy.server",
    "start_server": "trtllm_forge.deploy.server",
    "stop_server": "trtllm_forge.deploy.server",
    "Deployment": "trtllm_forge.deploy.kinds",
    "server_status": "trtllm_forge.deploy.kinds",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
