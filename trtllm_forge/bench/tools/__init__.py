"""Other load generators (perf_analyzer, GenAI-Perf, AIPerf): one module per tool behind `protocol.BenchTool`,
listed once in `registry.TOOLS` (`bench --tool`, `--emit` and `bench import` take the tools from there)."""
