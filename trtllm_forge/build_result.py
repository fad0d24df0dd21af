"""The build stage's typed result; defined with the other stages' results in `trtllm_forge.stage_results`
(kept importable from here for existing callers)."""

from trtllm_forge.stage_results import BuildResult

__all__ = ["BuildResult"]
