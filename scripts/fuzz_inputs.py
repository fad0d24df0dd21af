#!/usr/bin/env python3
"""Fuzz config loading and `render --check` with many more cases than the suite runs.

    python scripts/fuzz_inputs.py [--examples N] [--same-cases]

Runs tests/test_fuzz_inputs.py with FORGE_FUZZ_EXAMPLES=N (default 2000) and, unless --same-cases, new
random cases each run (FORGE_FUZZ_RANDOM=1). A failure prints hypothesis's smallest failing case.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=2000, help="cases per property (default 2000)")
    parser.add_argument("--same-cases", action="store_true", help="the suite's derandomized cases, just more of them")
    args = parser.parse_args()
    env = {**os.environ, "FORGE_FUZZ_EXAMPLES": str(args.examples)}
    if not args.same_cases:
        env["FORGE_FUZZ_RANDOM"] = "1"
    argv = [sys.executable, "-m", "pytest", str(REPO / "tests" / "test_fuzz_inputs.py"), "-q", "-p", "no:cacheprovider"]
    print("$", " ".join(argv), f"(FORGE_FUZZ_EXAMPLES={args.examples})", flush=True)
    return subprocess.call(argv, cwd=REPO, env=env)


if __name__ == "__main__":
    sys.exit(main())
