"""render stage: config + engine -> a complete, validated Triton model repository and its launch command."""

from trtllm_forge.render.repository import render_repository, render_to_directory
from trtllm_forge.render.validate import Problem, check_repository

__all__ = ["Problem", "check_repository", "render_repository", "render_to_directory"]
