"""`verify` as a stage: find the checkpoint, engine and running server of a workdir, check, write the report."""

from __future__ import annotations

from pathlib import Path

from trtllm_forge.config.schema import ForgeConfig
from trtllm_forge.errors import ConfigError, StepError
from trtllm_forge.stages import read_manifest, write_json_atomic
from trtllm_forge.ui import console
from trtllm_forge.verify.check import VerifyReport, run_checks
from trtllm_forge.verify.present import verify_summary, verify_table


def stage_output(workdir: Path, stage: str, key: str, hint: str) -> Path:
    manifest = read_manifest(workdir / stage)
    if not manifest or key not in manifest.get("outputs", {}):
        raise ConfigError(f"--workdir {workdir}", f"no {stage} output found", hint)
    return Path(manifest["outputs"][key])


def verify_deployment(config: ForgeConfig, workdir: Path, deployment=None) -> VerifyReport:
    from trtllm_forge.deploy import server_status

    checkpoint_dir = stage_output(workdir, "import", "checkpoint_dir", "run `trtllm-forge import CONFIG` first")
    build = read_manifest(workdir / "build") or {}
    engine_dir = build.get("outputs", {}).get("engine_dir")
    if deployment is None:
        deployment = server_status(workdir)
        if deployment is None or not deployment.running:
            raise StepError("verify", f"no running deployment in {workdir}", "start one with `trtllm-forge deploy CONFIG`")
    report = run_checks(config, deployment, checkpoint_dir, Path(engine_dir) if engine_dir else None)
    write_json_atomic(workdir / "verify" / "report.json", report.to_json())
    console.print(verify_table(report))
    console.print(verify_summary(report))
    return report
