"""The ONNX Runtime GenAI (CPU) engine builder: `build_engine(config, workdir, checkpoint_dir, force)`."""

from trtllm_forge.builders.onnxruntime.builder import BuildPlan, OnnxRuntimeBuilder, build_engine, plan_build

__all__ = ["BuildPlan", "OnnxRuntimeBuilder", "build_engine", "plan_build"]
