"""The Python environment the Triton python stub runs our models in (the EXECUTION_ENV_PATH parameter).

For local deployments it is trtllm-forge's own venv, so the stub imports the same tokenizers and OpenVINO
GenAI we tested with. That venv keeps NumPy 1.x on purpose: the python-backend stub of nvidia-pytriton 0.7.0
(Triton 2.51) was built against NumPy 1, and under NumPy 2 every STRING input reaches model.py as copies of
its first byte and numeric tensors lose their data (deploy refuses such an environment).
"""

from __future__ import annotations

import sys
from pathlib import Path


def project_env() -> Path:
    return Path(sys.prefix).resolve()
