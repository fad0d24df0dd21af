"""The arguments of one `trtllm-forge bench` run, for the scripts and tests that run bench the way a user does
(through the CLI). One definition, so the fidelity script and the tests send the same options."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any


def bench_options(
    url: str,
    *,
    target: str | None = None,
    model: str = "ensemble",
    concurrency: int | str | None = None,
    num_requests: int | None = None,
    warmup: int | None = None,
    input_len: int | None = None,
    output_len: int | None = None,
    tokenizer: Path | None = None,
    tool: str | None = None,
    out: Path | None = None,
    extra: tuple[str, ...] = (),
    plots: bool = False,
) -> list[str]:
    """`--url URL --model MODEL ...` as `bench` takes them; options left None are not passed."""
    options = [] if target is None else ["--target", target]
    options += ["--url", url, "--model", model]
    for flag, value in (
        ("--concurrency", concurrency),
        ("--num-requests", num_requests),
        ("--warmup", warmup),
        ("--input-len", input_len),
        ("--output-len", output_len),
        ("--tokenizer", tokenizer),
        ("--tool", tool),
        ("--out", out),
    ):
        if value is not None:
            options += [flag, str(value)]
    options += list(extra)
    if not plots:
        options.append("--no-plots")
    return options


def bench_argv(url: str, **options: Any) -> list[str]:
    """`python -m trtllm_forge bench ... --json`: one run in its own process (see bench_options)."""
    return [sys.executable, "-m", "trtllm_forge", "bench", *bench_options(url, **options), "--json"]
