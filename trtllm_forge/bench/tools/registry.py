"""The external load generators, listed once: `bench --tool` and `--emit` take their choices from `NAMES`,
`bench import` asks each tool's reader in this order (the first that knows a file reads it)."""

from __future__ import annotations

from trtllm_forge.bench.tools.aiperf import AIPerf
from trtllm_forge.bench.tools.genai_perf import GenAIPerf
from trtllm_forge.bench.tools.perf_analyzer import PerfAnalyzer
from trtllm_forge.bench.tools.protocol import BenchTool

TOOLS: tuple[BenchTool, ...] = (PerfAnalyzer(), GenAIPerf(), AIPerf())
NAMES = tuple(tool.name for tool in TOOLS)
_BY_NAME = dict(zip(NAMES, TOOLS, strict=True))


def tool(name: str) -> BenchTool:
    """The tool called `name`, one of NAMES (the CLI's choices check it first)."""
    return _BY_NAME[name]
