"""Runs inside AIConfigurator's own venv (`make setup` creates .venv-aiconfigurator: it needs numpy 2, we pin numpy 1).

Started by trtllm_forge/plan/aiconfigurator.py as `<that venv's python> aiconfigurator_bridge.py`, it reads one JSON
request on stdin and writes one JSON answer on stdout; AIConfigurator's own prints and logs go to stderr. It imports
only the standard library and AIConfigurator (trtllm_forge is not installed in that venv).

Requests: {"op": "catalog"} -> the installed versions, the systems with a database per backend, the bundled model
configs; {"op": "estimate", ...} -> cli_support's verdict and, when it supports the combination, cli_estimate's
aggregated (in-flight batching) estimate. Every answer has "status": "simulated" | "unsupported" | "unavailable"
(AIConfigurator missing) or "ok" (catalog); an error inside AIConfigurator is an answer, never a traceback on stdout.
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

BACKEND = "trtllm"
# The keys of an estimate's result row that forge reports (AIConfigurator's names -> ours).
VALUES = {
    "ttft": "ttft_ms",
    "tpot": "tpot_ms",
    "tokens/s/gpu": "tokens_per_s_per_gpu",
    "tokens/s/user": "tokens_per_s_per_user",
    "tokens/s": "tokens_per_s",
    "request_latency": "request_latency_ms",
    "concurrency": "concurrency",
    "num_total_gpus": "gpus",
    "memory": "memory_gib_per_gpu",
}


def versions() -> dict[str, str]:
    return {name: metadata.version(name) for name in ("aiconfigurator", "aiconfigurator-core")}


def catalog() -> dict[str, Any]:
    import aiconfigurator_core
    from aiconfigurator.sdk.perf_database import get_supported_databases

    configs = Path(aiconfigurator_core.__file__).parent / "model_configs"
    return {
        "status": "ok",
        "versions": versions(),
        "databases": get_supported_databases(),
        "model_configs": {p.name.removesuffix("_config.json").replace("--", "/", 1): str(p) for p in sorted(configs.glob("*_config.json"))},
    }


def estimate(request: dict[str, Any]) -> dict[str, Any]:
    from aiconfigurator.cli.api import cli_estimate, cli_support
    from aiconfigurator.sdk.perf_database import get_supported_databases

    model, system = request["model"], request["system"]
    answer: dict[str, Any] = {
        "versions": versions(),
        "backend": BACKEND,
        "backend_versions": get_supported_databases().get(system, {}).get(BACKEND, []),
    }
    support = cli_support(model, system, backend=BACKEND)
    if not support.agg_supported:
        return {
            **answer,
            "status": "unsupported",
            "reason": f"AIConfigurator's support matrix has no passing aggregated run of {model} on {system} ({BACKEND})",
        }
    result = cli_estimate(model, system, mode="agg", backend_name=BACKEND, **request["arguments"])
    raw = result.get()
    values = {ours: raw.get(theirs) for theirs, ours in VALUES.items()}
    missing = [theirs for theirs, ours in VALUES.items() if not _positive(values[ours])]
    if missing:
        return {**answer, "status": "unsupported", "reason": f"AIConfigurator returned no {', '.join(missing)} for {model} on {system}"}
    return {
        **answer,
        "status": "simulated",
        "backend_version": result.backend_version,
        "values": values,
        "quantization": {k: raw.get(k) for k in ("gemm", "kvcache", "fmha", "moe", "comm")},
        "kv_cache_warning": result.kv_cache_warning,
    }


def _positive(value: object) -> bool:
    return isinstance(value, int | float) and math.isfinite(value) and value > 0


def answer(request: dict[str, Any]) -> dict[str, Any]:
    try:
        import aiconfigurator.cli.api  # noqa: F401
    except ImportError as error:
        return {"status": "unavailable", "reason": f"AIConfigurator is not importable by {sys.executable}: {error}"}
    try:
        return catalog() if request.get("op") == "catalog" else estimate(request)
    except Exception as error:  # AIConfigurator's refusals are exceptions (ValueError, RuntimeError for OOM, ...)
        first_line = (str(error).strip().splitlines() or [""])[0]
        return {"status": "unsupported", "reason": f"AIConfigurator: {type(error).__name__}: {first_line}"}


def main() -> int:
    request = json.load(sys.stdin)
    with contextlib.redirect_stdout(sys.stderr):
        response = answer(request)
    json.dump(response, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
