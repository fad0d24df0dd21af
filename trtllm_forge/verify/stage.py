"""`verify` as a stage: find the checkpoint, engine and running server of a workdir, check, write the report."""

from __future__ import annotations

from pathlib import Path

from trtllm_forge.config.schema import ForgeConfig
from trtllm_forge.errors import ConfigError, StepError
from trtllm_forge.importer.stage import imported_checkpoint
from trtllm_forge.stages import stage_output, write_json_atomic
from trtllm_forge.ui import console
from trtllm_forge.verify.check import VerifyReport, run_checks
from trtllm_forge.verify.present import verify_summary, verify_table


def verify_deployment(config: ForgeConfig, workdir: Path, deployment=None) -> VerifyReport:
    from trtllm_forge.deploy import server_status

    checkpoint_dir = imported_checkpoint(workdir)
    if checkpoint_dir is None:
        raise ConfigError(f"--workdir {workdir}", "no import output found", "run `trtllm-forge import CONFIG` first")
    engine_dir = stage_output(workdir, "build", "engine_dir")
    if deployment is None:
        deployment = server_status(workdir)
        if deployment is None or not deployment.running:
            raise StepError("verify", f"no running deployment in {workdir}", "start one with `trtllm-forge deploy CONFIG`")
    report = run_checks(config, deployment, checkpoint_dir, Path(engine_dir) if engine_dir else None)
    write_json_atomic(workdir / "verify" / "report.json", report.to_json())
    console.print(verify_table(report))
    console.print(verify_summary(report))
    return report
