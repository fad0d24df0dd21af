"""TensorRT-LLM 1.2.x builder: plan (checked against the versioned spec), then run in the GPU container.

`tensorrt_llm` itself is never imported at module import time: this package must load on machines without it.
"""

from trtllm_forge.builders.tensorrt_llm.adjust import PlanWarning
from trtllm_forge.builders.tensorrt_llm.plan import BuildPlan, Step, plan_build

__all__ = ["BuildPlan", "PlanWarning", "Step", "build", "expected_engine_config", "plan_build"]


def build(config, workdir, checkpoint_dir, force=False, dry_run=False, as_json=False):
    from trtllm_forge.builders.tensorrt_llm.execute import build as _build

    return _build(config, workdir, checkpoint_dir, force=force, dry_run=dry_run, as_json=as_json)


def expected_engine_config(plan):
    from trtllm_forge.builders.tensorrt_llm.engine_fixture import expected_engine_config as _expected

    return _expected(plan)
