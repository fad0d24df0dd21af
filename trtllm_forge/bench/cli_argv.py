"""The argument list of one `trtllm-forge bench` run, for the scripts and tests that run bench the way a user
does (its own process, through the CLI). One definition, so the fidelity script and the tests send the same."""

from __future__ import annotations

import sys
from pathlib import Path


def bench_argv(
    url: str,
    *,
    model: str = "ensemble",
    concurrency: int | str | None = None,
    num_requests: int | None = None,
    input_len: int | None = None,
    output_len: int | None = None,
    warmup: int | None = None,
    tokenizer: Path | None = None,
    out: Path | None = None,
    tool: str | None = None,
    extra: tuple[str, ...] = (),
    as_json: bool = True,
) -> list[str]:
    """`python -m trtllm_forge bench --url URL --model MODEL ...`; options left None are not passed."""
    argv = [sys.executable, "-m", "trtllm_forge", "bench", "--url", url, "--model", model]
    for flag, value in (
        ("--concurrency", concurrency),
        ("--num-requests", num_requests),
        ("--warmup", warmup),
        ("--input-len", input_len),
        ("--output-len", output_len),
        ("--tokenizer", tokenizer),
        ("--out", out),
        ("--tool", tool),
    ):
        if value is not None:
            argv += [flag, str(value)]
    argv += list(extra)
    if out is not None:
        argv.append("--no-plots")
    if as_json:
        argv.append("--json")
    return argv
