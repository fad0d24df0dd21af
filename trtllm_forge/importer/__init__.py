"""import stage: turn `model.source` (built-in SmolLM2, a .gguf file or a local HF directory) into a checked
Hugging Face checkpoint directory under <workdir>/import/.

Entry points: `trtllm_forge.importer.stage.import_checkpoint` (the stage) and `plan_import` (--dry-run).
The heavy conversion (torch, transformers) runs in a child process: `python -m trtllm_forge.importer.gguf_to_hf`.
"""
