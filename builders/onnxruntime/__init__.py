"""The ONNX Runtime GenAI (CPU) engine: its descriptor (`engine.py`) and its builder (`builder.py`:
`OnnxRuntimeBuilder`, `build_engine`, `plan_build`).

Imports nothing: the config reads `engine.py` and must not pull in the builder, which reads the config.
"""
