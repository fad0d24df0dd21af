"""`trtllm-forge doctor`: what this machine has and lacks for each stage, and the fix for each."""

from __future__ import annotations

import sys

import click
from rich.text import Text

from trtllm_forge import __version__
from trtllm_forge.commands.options import json_option
from trtllm_forge.ui import console, emit_json

NOT_READY_EXIT = 1  # a check the default CPU chain needs failed


@click.command()
@json_option
def doctor(as_json: bool) -> None:
    """List what this machine has and lacks for each stage, with the fix for each.

    \b
    Checks: tritonserver (nvidia-pytriton's or one on PATH / in /opt), the python backend stub,
    numpy<2, tritonclient, the built-in model, transformers/torch, OpenVINO (GenAI) and
    optimum-cli, and the optional perf_analyzer, genai-perf, docker, GPU and driver, TensorRT-LLM.

    Exit codes: 0 the default CPU chain (configs/smollm2-cpu.yaml) can run here, optional tools
    may be missing; 1 something it needs is missing (each such line says how to fix it).
    """
    from trtllm_forge.doctor import cpu_chain_ready, run_checks

    checks = run_checks()
    ready = cpu_chain_ready(checks)
    if as_json:
        emit_json(
            {
                "trtllm-forge": __version__,
                "python": sys.version.split()[0],
                "cpu_chain_ready": ready,
                "checks": [c.to_dict() for c in checks],
            }
        )
    else:
        width = max(len(c.name) for c in checks)
        for check in checks:
            mark, style = ("✓", "green") if check.ok else (("✗", "red") if check.required else ("-", "yellow"))
            line = Text(f"{mark} ", style=style)
            line.append(f"{check.name:{width}}  {check.found}")
            line.append(f"  [{check.needed_for}{'' if check.required else '; optional'}]", style="dim")
            console.print(line)
            if check.fix:
                console.print(Text(f"  {'':{width}}  fix: {check.fix}"))
        verdict = "the default CPU chain can run here" if ready else "the default CPU chain cannot run here: fix the ✗ lines"
        console.print(Text(verdict, style="green" if ready else "red"))
    if not ready:
        sys.exit(NOT_READY_EXIT)
