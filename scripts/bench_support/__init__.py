"""What the benchmark scripts and the tests share, outside the installed package: a Triton on the timing model
(`local_triton`: a python-backend model with a known token schedule, `timing_model/`) and the argv of one
`trtllm-forge bench` run (`cli_argv`). Scripts import it as `bench_support` (scripts/ is on their path); pytest puts
scripts/ on the tests' path (pyproject's [tool.pytest.ini_options] pythonpath)."""
