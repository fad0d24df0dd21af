"""`plan --predict`: NVIDIA AIConfigurator's simulated TTFT, TPOT, throughput and memory for the plan's config.

AIConfigurator (PyPI `aiconfigurator` + `aiconfigurator-core`, pinned in the Makefile) estimates from NVIDIA's
measured kernel database, offline and without a GPU. It needs numpy 2 and we pin numpy 1, so `make setup` gives it
its own venv (.venv-aiconfigurator next to .venv; FORGE_AICONFIGURATOR_PYTHON overrides the interpreter) and it runs
there as a subprocess: aiconfigurator_bridge.py, one JSON request on stdin, one JSON answer on stdout. The process
can exit 0 on errors, so the answer is checked, not the exit code.

Its TensorRT-LLM databases are of the 1.3 line (1.3.0rc20 and rc23; 1.0.0 on A100), the PyTorch backend behind the
LLM API: there is no 1.2 engine-path model, and the prediction says so for an engine-path config.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from trtllm_forge.errors import ConfigError
from trtllm_forge.plan.planner import Plan

PYTHON_ENV = "FORGE_AICONFIGURATOR_PYTHON"
VENV_NAME = ".venv-aiconfigurator"  # the Makefile's AIC_VENV
BRIDGE = Path(__file__).with_name("aiconfigurator_bridge.py")
TIMEOUT_S = 180.0
SOURCE = "aiconfigurator"
DATABASE_SOURCE = "aiconfigurator-core"  # the wheel that holds the systems' measured data and the model configs

Status = Literal["simulated", "unsupported", "unavailable"]


@dataclass(frozen=True)
class NameMatch:
    """One of our names and AIConfigurator's for the same thing, with why they are the same."""

    aiconfigurator: str
    source: str


# forge's data/hardware.json names -> AIConfigurator's system names. Systems from aiconfigurator-core 0.12.0
# `systems/<name>.yaml` with a TensorRT-LLM database under `systems/data/<name>/` (get_supported_databases());
# its h100_pcie, a100_pcie, l4 and a30 systems have no data, and it has no system for H20, A100-40GB, A10G, RTX-4090.
SYSTEMS: dict[str, NameMatch] = {
    "H100-SXM": NameMatch("h100_sxm", "systems/h100_sxm.yaml: H100 SXM, 80 GiB, 3.35 TB/s"),
    "H200": NameMatch("h200_sxm", "systems/h200_sxm.yaml: H200 SXM, 141 GB"),
    "A100-80GB": NameMatch("a100_sxm", "systems/a100_sxm.yaml: A100 SXM 80 GiB, 2.039 TB/s (TensorRT-LLM 1.0.0 data only)"),
    "L40S": NameMatch("l40s", "systems/l40s.yaml: L40S, 48 GB"),
    "B200": NameMatch("b200_sxm", "systems/b200_sxm.yaml: B200 SXM"),
    "GB200": NameMatch("gb200", "systems/gb200.yaml: GB200 (per GPU)"),
}

# forge's `model.name` (data/model_catalog.json) -> the Hugging Face id of a model config AIConfigurator bundles
# (aiconfigurator-core 0.12.0 `model_configs/<org>--<name>_config.json`). The instruction-tuned checkpoint has the
# base model's shapes; tests/test_plan_predict.py compares both shapes field by field.
MODELS: dict[str, NameMatch] = {
    "meta-llama/Llama-3.1-8B-Instruct": NameMatch(
        "meta-llama/Meta-Llama-3.1-8B", "model_configs/meta-llama--Meta-Llama-3.1-8B_config.json (base model, same shapes)"
    ),
    "meta-llama/Llama-3.1-70B-Instruct": NameMatch(
        "meta-llama/Meta-Llama-3.1-70B", "model_configs/meta-llama--Meta-Llama-3.1-70B_config.json (base model, same shapes)"
    ),
    "mistralai/Mixtral-8x7B-Instruct-v0.1": NameMatch(
        "mistralai/Mixtral-8x7B-v0.1", "model_configs/mistralai--Mixtral-8x7B-v0.1_config.json (base model, same shapes)"
    ),
}

# quantization.algorithm -> AIConfigurator's GEMMQuantMode (aiconfigurator_core/sdk/common.py); float16 and
# bfloat16 weights are both its bfloat16 lane. w4a8_awq has no counterpart there.
GEMM_QUANT = {
    "none": "bfloat16",
    "fp8": "fp8",
    "int4_awq": "int4_wo",
    "int4_wo": "int4_wo",
    "int8_wo": "int8_wo",
    "int8_sq": "sq",
    "nvfp4": "nvfp4",
}
# The MoE experts' quant mode (MoEQuantMode) for the same algorithms; int8 experts have none.
MOE_QUANT = {"none": "bfloat16", "fp8": "fp8", "int4_awq": "int4_wo", "int4_wo": "int4_wo", "nvfp4": "nvfp4"}
KV_QUANT = {"none": "bfloat16", "fp8": "fp8", "int8": "int8"}


@dataclass
class Prediction:
    """The `prediction` object of plan.json."""

    status: Status
    reason: str | None = None  # why it is unsupported or unavailable: one line
    source: str = SOURCE
    version: str | None = None  # aiconfigurator's
    database_source: str = DATABASE_SOURCE
    database_version: str | None = None  # aiconfigurator-core's: the measured data ships in that wheel
    backend: str = "trtllm"
    backend_version: str | None = None  # the TensorRT-LLM version of the database the estimate used
    backend_versions: list[str] = field(default_factory=list)  # every TensorRT-LLM database it has for the system
    system: str | None = None
    model: str | None = None
    inputs: dict[str, Any] = field(default_factory=dict)
    values: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Request:
    """What AIConfigurator is asked: its names and cli_estimate's keyword arguments."""

    model: str
    system: str
    arguments: dict[str, Any]
    notes: list[str]


def aiconfigurator_python() -> Path:
    override = os.environ.get(PYTHON_ENV)
    if override:
        return Path(override).expanduser()
    return Path(sys.prefix).parent / VENV_NAME / "bin" / "python"


def request_for(plan: Plan) -> Request | ConfigError:
    """The config's GPU, model, parallelism, batch size and ISL/OSL in AIConfigurator's terms, or why it has none
    (returned, not raised: `plan --predict` reports it as unsupported beside the rest of the plan)."""
    config = plan.config
    eng, quant, mapping = config.engine, config.quantization, plan.mapping
    system = SYSTEMS.get(config.hardware.gpu)
    if system is None:
        return ConfigError(
            "hardware.gpu",
            f"AIConfigurator has no TensorRT-LLM database for {config.hardware.gpu}",
            f"it has one for {', '.join(SYSTEMS)}",
        )
    model = MODELS.get(config.model.name or "")
    if model is None:
        return ConfigError(
            "model.name",
            f"AIConfigurator bundles no model config matching {config.model.name or config.model.source!r}",
            f"models it can simulate: {', '.join(MODELS)}",
        )
    gemm = GEMM_QUANT.get(quant.algorithm)
    moe = MOE_QUANT.get(quant.algorithm) if plan.shape.is_moe else None
    if gemm is None or (plan.shape.is_moe and moe is None):
        usable = MOE_QUANT if plan.shape.is_moe else GEMM_QUANT
        return ConfigError(
            "quantization.algorithm", f"AIConfigurator has no quant mode for {quant.algorithm}", f"it simulates {', '.join(usable)}"
        )
    w = plan.workload
    arguments: dict[str, Any] = {
        "isl": w.input_len,
        "osl": w.output_len,
        "batch_size": eng.max_batch_size,
        "ctx_tokens": eng.resolved_max_num_tokens,
        "tp_size": mapping.tp,
        "pp_size": mapping.pp,
        "gemm_quant_mode": gemm,
        "kvcache_quant_mode": KV_QUANT[quant.kv_cache],
        "free_gpu_memory_fraction": config.runtime.kv_cache_free_gpu_mem_fraction,
        "max_seq_len": eng.max_seq_len,
    }
    if plan.shape.is_moe:
        arguments |= {"moe_quant_mode": moe, "moe_ep_size": mapping.moe_ep, "moe_tp_size": mapping.moe_tp}
    notes = [f"model.name {config.model.name} is simulated as {model.aiconfigurator}: {model.source}"]
    if eng.backend == "tensorrt-llm" and eng.target == "engine":
        notes.append(
            "this config builds a TensorRT-LLM 1.2.x engine (engine.target: engine); AIConfigurator has no 1.2 engine-path "
            "data: the prediction is for the LLM API (PyTorch backend) of its database's TensorRT-LLM version"
        )
    if eng.speculative.mode != "none":
        notes.append(f"engine.speculative.mode {eng.speculative.mode} is not simulated (AIConfigurator models MTP only): no speculation")
    if quant.algorithm == "int4_awq":
        notes.append("int4_awq is simulated as int4_wo (4-bit weights, 16-bit activations)")
    if plan.dtype == "float16" and quant.algorithm == "none":
        notes.append("float16 weights are simulated as bfloat16 (the same GEMM lane)")
    return Request(model.aiconfigurator, system.aiconfigurator, arguments, notes)


def call_bridge(request: dict[str, Any], python: Path | None = None) -> dict[str, Any]:
    """One bridge run: its JSON answer, or an "unavailable" answer saying what went wrong (one line)."""
    python = python or aiconfigurator_python()
    if not python.exists():
        return {
            "status": "unavailable",
            "reason": f"AIConfigurator is not installed ({python} is missing): run `make setup` or set {PYTHON_ENV}",
        }
    # Offline: every model it is asked about is bundled; nothing may reach the Hugging Face Hub.
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    # -I: the bridge's own folder (this package's plan/: memory.py, plot.py, ...) must not shadow AIConfigurator's
    # imports, nor may PYTHONPATH or the user's site-packages reach into that venv.
    try:
        done = subprocess.run(
            [str(python), "-I", str(BRIDGE)],
            input=json.dumps(request),
            capture_output=True,
            text=True,
            env=env,
            timeout=TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return {"status": "unavailable", "reason": f"AIConfigurator did not answer within {TIMEOUT_S:.0f} s"}
    except OSError as error:
        return {"status": "unavailable", "reason": f"cannot run {python}: {error}"}
    last_err = (done.stderr.strip().splitlines() or ["no output on stderr"])[-1]
    try:
        answer = json.loads(done.stdout)
    except ValueError:
        return {"status": "unavailable", "reason": f"AIConfigurator's bridge gave no JSON answer (exit {done.returncode}): {last_err}"}
    if not isinstance(answer, dict) or answer.get("status") not in ("simulated", "unsupported", "unavailable", "ok"):
        return {"status": "unavailable", "reason": f"AIConfigurator's bridge answered without a known status (exit {done.returncode})"}
    return answer


def predict(plan: Plan, python: Path | None = None) -> Prediction:
    asked = request_for(plan)
    if isinstance(asked, ConfigError):
        return Prediction(status="unsupported", reason=asked.format_message())
    answer = call_bridge({"op": "estimate", "model": asked.model, "system": asked.system, "arguments": asked.arguments}, python)
    versions = answer.get("versions") or {}
    status: Status = answer["status"] if answer["status"] in ("simulated", "unsupported") else "unavailable"
    prediction = Prediction(
        status=status,
        reason=answer.get("reason") or (None if status != "unavailable" else "AIConfigurator's bridge gave no estimate"),
        version=versions.get(SOURCE),
        database_version=versions.get(DATABASE_SOURCE),
        backend_version=answer.get("backend_version"),
        backend_versions=answer.get("backend_versions") or [],
        system=asked.system,
        model=asked.model,
        inputs=asked.arguments,
        values=answer.get("values") or {},
        notes=list(asked.notes),
    )
    if prediction.status == "simulated":
        quant = answer.get("quantization") or {}
        prediction.notes.append("simulated with " + ", ".join(f"{k} {v}" for k, v in quant.items() if v))
        if answer.get("kv_cache_warning"):
            prediction.notes.append(f"AIConfigurator: {answer['kv_cache_warning']}")
        prediction.notes.append("a simulation from NVIDIA's kernel database, not a measurement: it can be far off (aiconfigurator#1396)")
    return prediction


def catalog(python: Path | None = None) -> dict[str, Any]:
    """AIConfigurator's versions, its databases per system and backend, and the model configs it bundles."""
    return call_bridge({"op": "catalog"}, python)
