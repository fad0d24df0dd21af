"""TensorRT-LLM's own config rules, run by config/checks.py's `backend_rules` for engine.backend tensorrt-llm
(named by the descriptor's `config_rules`, builders/tensorrt_llm/engine.py): the spec's compute-capability rules for
quantization (quant.py, the same check plan_build makes), found when the config is loaded."""

from __future__ import annotations

from collections.abc import Iterator

from trtllm_forge.builders.tensorrt_llm.quant import capability_problems, choose, sm_of
from trtllm_forge.builders.tensorrt_llm.spec import load_spec

from trtllm_forge.config.checks import CheckContext
from trtllm_forge.errors import ConfigError


def config_problems(ctx: CheckContext) -> Iterator[ConfigError]:
    cc = ctx.compute_capability
    if cc is None:
        return
    quant = ctx.config.quantization
    try:
        spec = load_spec(ctx.config.engine.trtllm_version)
        choice = choose(quant.algorithm, quant.kv_cache, spec)
    except ConfigError:
        return  # an unknown version or algorithm is the build's to report
    yield from capability_problems(choice, sm_of(cc), ctx.device_name, spec, plugin_flags={})
