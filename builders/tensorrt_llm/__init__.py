"""TensorRT-LLM 1.2.x: its descriptor (`engine.py`), the plan checked against the versioned spec (`plan.py`
`plan_build`), and the build in the GPU container (`execute.py`).

Imports nothing: the config reads `engine.py` and must not pull in the builder, which reads the config. `tensorrt_llm`
itself is never imported at module import time: this package must load on machines without it.
"""
