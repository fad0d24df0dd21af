"""The OpenVINO (CPU) engine builder: `build_engine(config, workdir, checkpoint_dir, force)`."""

from trtllm_forge.builders.openvino.builder import BuildPlan, OpenVINOBuilder, build_engine, plan_build

__all__ = ["BuildPlan", "OpenVINOBuilder", "build_engine", "plan_build"]
