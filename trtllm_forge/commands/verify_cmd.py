"""`trtllm-forge verify CONFIG`: the deployed endpoint against transformers on the same checkpoint."""

from __future__ import annotations

from pathlib import Path

import click

from trtllm_forge.commands.options import config_argument, json_option, load, workdir_option
from trtllm_forge.errors import StepError
from trtllm_forge.ui import emit_json


@click.command("verify")
@config_argument
@workdir_option
@json_option
def verify(config_file: Path, workdir: Path | None, as_json: bool) -> None:
    """Send the config's verify prompts (greedy) through the running deployment and compare with transformers.

    Unquantized engines must match token for token (an answer that runs past transformers' end is a mismatch);
    quantized ones are held to verify.min_token_agreement and, where verify can load the engine (OpenVINO, ONNX
    Runtime), verify.max_perplexity_increase; where it cannot (TensorRT-LLM), the report says the perplexity was
    not checked. Writes <workdir>/verify/report.json; exits 1 when a check fails.
    """
    from trtllm_forge.verify.stage import verify_deployment

    config, workdir = load(config_file, workdir)
    report = verify_deployment(config, workdir)
    if as_json:
        emit_json(report.to_json())
    if not report.passed:
        raise StepError("verify", "; ".join(report.problems), f"see {workdir / 'verify' / 'report.json'}")
