"""trtllm-forge: one YAML file from an LLM checkpoint to a served, measured endpoint."""

__version__ = "0.1.0"
