"""verify's verdict: a quantized engine's perplexity measured wherever verify can load the engine (the session's real
int4 ONNX Runtime build and fp32 OpenVINO build against the real transformers reference), and said to be not checked
where it cannot (TensorRT-LLM). An answer past transformers' end of sequence: test_verify_reference.py."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest
from conftest import CONFIGS, cpu_test_config, onnxruntime_int4_config

from trtllm_forge.config import ForgeConfig, load_config
from trtllm_forge.ui import console
from trtllm_forge.verify.check import (
    PerplexityCheck,
    PerplexityStatus,
    PromptCheck,
    VerifyReport,
    build_report,
    check_perplexity,
    perplexity_problems,
)
from trtllm_forge.verify.engine_scorers import SCORERS, Unscorable, engine_scorer, openvino_perplexity
from trtllm_forge.verify.onnxruntime_engine import summed_nll
from trtllm_forge.verify.present import verify_summary, verify_table
from trtllm_forge.verify.reference import Perplexity, compare_tokens

GPU_FP8 = CONFIGS / "llama3.1-8b-fp8-h100.yaml"  # a quantized TensorRT-LLM engine


def _never() -> Perplexity:
    raise AssertionError("the reference's perplexity was asked for although no engine is scored")


def _check(prompt: str, ref_ids: list[int], got_ids: list[int], ref_text: str = "x", got_text: str = "x") -> PromptCheck:
    return PromptCheck(prompt, ref_text, got_text, got_text, ref_ids, got_ids, compare_tokens(ref_ids, got_ids))


def _with_verify(config: ForgeConfig, **verify: object) -> ForgeConfig:
    data = config.model_dump(mode="json")
    data["verify"].update(verify)
    return ForgeConfig.model_validate({**data, "config_dir": str(CONFIGS)})


def _shown(report: VerifyReport) -> str:
    with console.capture() as captured:
        console.print(verify_table(report))
        console.print(verify_summary(report))
    return captured.get()


# ---- which engines verify scores (fast) ----


def test_every_engine_backend_has_a_scorer_or_a_reason():
    from typing import get_args

    from trtllm_forge.builders.engines import ENGINES

    from trtllm_forge.config.schema import EngineConfig

    backends = get_args(EngineConfig.model_fields["backend"].annotation)
    assert sorted(engine.backend for engine in ENGINES) == sorted(backends)
    assert {engine.verify_scorer for engine in ENGINES} - {None} == set(SCORERS)  # every named scorer exists, none unused
    assert callable(engine_scorer("onnxruntime")) and callable(engine_scorer("openvino"))
    assert isinstance(engine_scorer("tensorrt-llm"), Unscorable)
    unknown = engine_scorer("vllm")
    assert isinstance(unknown, Unscorable) and "'vllm'" in unknown.reason


def test_summed_nll_equals_torch_cross_entropy():
    import torch

    rng = np.random.default_rng(0)
    logits = rng.normal(scale=4.0, size=(7, 50)).astype(np.float32)
    targets = [int(t) for t in rng.integers(0, 50, size=7)]
    expected = torch.nn.functional.cross_entropy(torch.from_numpy(logits), torch.tensor(targets), reduction="sum")
    assert summed_nll(logits, targets) == pytest.approx(float(expected), rel=1e-5)


def test_an_unquantized_engine_needs_no_perplexity():
    check = check_perplexity(cpu_test_config(), Path("/nonexistent"), _never)
    assert check.status is PerplexityStatus.NOT_NEEDED and check.engine is None
    assert perplexity_problems(check, required=True) == []


def test_a_quantized_tensorrt_llm_engine_is_said_to_be_checked_on_agreement_only(tmp_path):
    config = load_config(GPU_FP8)
    assert config.quantization.algorithm == "fp8" and config.engine.backend == "tensorrt-llm"
    check = check_perplexity(config, tmp_path, _never)
    assert check.status is PerplexityStatus.NOT_CHECKED and "TensorRT-LLM" in (check.reason or "")

    report = build_report(config, [_check("p", [1, 2, 3], [1, 2, 3])], check)
    assert report.passed and report.agreement_only
    doc = report.to_json()
    assert doc["agreement_only"] is True and doc["passed"] is True
    assert doc["perplexity"]["status"] == "not_checked" and doc["perplexity"]["reason"] == check.reason
    assert doc["perplexity"]["engine"] is None and doc["perplexity"]["increase"] is None
    shown = " ".join(_shown(report).split())
    assert "not checked" in shown and "TensorRT-LLM" in shown
    assert "checked on token agreement only" in shown and "verify passed" in shown

    strict = build_report(_with_verify(config, require_perplexity=True), report.checks, check)
    assert not strict.passed and "verify.require_perplexity" in strict.problems[0]


def test_a_quantized_engine_that_was_never_built_is_not_checked():
    config = onnxruntime_int4_config()
    check = check_perplexity(config, None, _never)
    assert check.status is PerplexityStatus.NOT_CHECKED and "build-engine" in (check.reason or "")


# ---- engines verify loads, scored for real ----


@pytest.fixture(scope="module")
def int4_check(ort_engine_int4, reference_perplexity) -> PerplexityCheck:
    engine_dir = ort_engine_int4[1].engine_dir
    assert engine_dir is not None
    return check_perplexity(onnxruntime_int4_config(), engine_dir, lambda: reference_perplexity)


@pytest.mark.slow
def test_the_int4_onnxruntime_engine_perplexity_is_measured_against_the_reference(int4_check):
    check = int4_check
    assert check.status is PerplexityStatus.CHECKED and check.engine and check.reference
    assert check.max_increase == onnxruntime_int4_config().verify.max_perplexity_increase
    # Same text, same tokens, same windows on both sides: only the model differs.
    assert (check.engine.predicted_tokens, check.engine.windows, check.engine.text_source) == (
        check.reference.predicted_tokens,
        check.reference.windows,
        check.reference.text_source,
    )
    assert check.engine.mean_nll == pytest.approx(math.log(check.engine.perplexity))
    # int4 weights cost a 135M model some perplexity; a logit row off by one position would cost orders of magnitude.
    increase = check.increase
    assert increase is not None and 0.0 < increase < 0.5, (check.engine, check.reference)

    # The config's threshold decides: the measured rise fails a limit below it and passes one above it.
    (problem,) = perplexity_problems(dataclasses.replace(check, max_increase=increase / 2), required=False)
    assert problem.startswith(f"perplexity rose {increase:.1%}")
    assert perplexity_problems(dataclasses.replace(check, max_increase=increase * 2), required=True) == []


@pytest.mark.slow
def test_the_measured_perplexity_is_in_verify_table_and_json(int4_check):
    engine, reference, increase = int4_check.engine, int4_check.reference, int4_check.increase
    assert engine and reference and increase is not None
    config = _with_verify(onnxruntime_int4_config(), max_perplexity_increase=round(increase, 3) + 0.01)
    check = dataclasses.replace(int4_check, max_increase=config.verify.max_perplexity_increase)
    report = build_report(config, [_check("p", [1, 2, 3], [1, 2, 3])], check)
    assert report.passed and not report.agreement_only, report.problems
    doc = report.to_json()["perplexity"]
    assert doc["status"] == "checked" and doc["reason"] is None
    assert doc["engine"] == engine.to_json() and doc["reference"] == reference.to_json()
    assert doc["increase"] == pytest.approx(increase) and doc["max_increase"] == config.verify.max_perplexity_increase
    shown = _shown(report)
    assert f"{engine.perplexity:.2f}" in shown and f"{reference.perplexity:.2f}" in shown and f"{increase:+.1%}" in shown
    assert "token agreement only" not in shown and "verify passed" in shown


@pytest.mark.slow
def test_the_fp32_openvino_engine_scores_the_reference_perplexity(cpu_engine_fp32, reference_perplexity):
    """The OpenVINO scorer on the session's fp32 engine: the same model, so the same perplexity (f32 inference)."""
    engine_dir = Path(cpu_engine_fp32[1].manifest["outputs"]["engine_dir"])
    engine = openvino_perplexity(cpu_test_config(), engine_dir)
    reference = reference_perplexity
    assert engine.predicted_tokens == reference.predicted_tokens
    assert engine.perplexity == pytest.approx(reference.perplexity, rel=0.005)
