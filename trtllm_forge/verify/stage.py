"""`verify` as a stage: find the checkpoint, engine and running server of a workdir, check, write the report."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from trtllm_forge.config.schema import ForgeConfig
from trtllm_forge.errors import ConfigError, StepError
from trtllm_forge.stage_results import BuildResult, ImportResult
from trtllm_forge.stages import write_json_atomic
from trtllm_forge.ui import console
from trtllm_forge.verify.check import VerifyReport, run_checks
from trtllm_forge.verify.present import verify_summary, verify_table

if TYPE_CHECKING:
    from trtllm_forge.deploy.kinds import Deployment


def verify_deployment(
    config: ForgeConfig,
    workdir: Path,
    deployment: Deployment | None = None,
    imported: ImportResult | None = None,
    built: BuildResult | None = None,
) -> VerifyReport:
    """Check the deployment against the checkpoint (and engine). `run` passes the stages' results; `verify` alone
    finds them in the workdir."""
    from trtllm_forge.deploy import server_status

    imported = imported or ImportResult.in_workdir(workdir)
    if imported is None:
        raise ConfigError(f"--workdir {workdir}", "no import output found", "run `trtllm-forge import CONFIG` first")
    built = built or BuildResult.in_workdir(workdir)
    if deployment is None:
        deployment = server_status(workdir)
        if deployment is None or not deployment.running:
            raise StepError("verify", f"no running deployment in {workdir}", "start one with `trtllm-forge deploy CONFIG`")
    report = run_checks(config, deployment, imported.checkpoint_dir, built.engine_dir if built else None)
    write_json_atomic(workdir / "verify" / "report.json", report.to_json())
    console.print(verify_table(report))
    console.print(verify_summary(report))
    return report
