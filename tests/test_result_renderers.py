"""The benchmark scripts' README renderers and the provenance record, on documents written here (no timing)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from trtllm_forge.bench import provenance

REPO = Path(__file__).resolve().parent.parent


def _script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"script_under_test_{name}", REPO / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _header(**extra: Any) -> dict[str, Any]:
    return {
        "git_commit": "0123456789abcdef0123456789abcdef01234567",
        "git_dirty": False,
        "started_utc": "2026-12-02T04:00:00Z",
        "machine": {"cpu_model": "Test CPU", "usable_cores": 2, "cpus": 2, "bandwidth_gb_s": 10.0, "load_average": [1.0, 1.0, 1.0]},
        **extra,
    }


def test_record_names_commit_machine_and_bandwidth(tmp_path: Path) -> None:
    document = provenance.finish(provenance.record(measure_bandwidth=True))
    assert len(document["git_commit"]) == 40 and isinstance(document["git_dirty"], bool)
    machine = document["machine"]
    assert machine["bandwidth_gb_s"] > 0 and machine["cpus"] >= 1 and len(machine["load_average_end"]) == 3
    out = provenance.write_result(tmp_path / "x" / "r.json", document)
    assert json.loads(out.read_text()) == document and not list(out.parent.glob("*.tmp"))


def test_peer_table_medians_and_ratios() -> None:
    peer = _script("bench_llamacpp_peer")
    runs = []
    for repeat, (ours_tps, peer_tps) in enumerate(((150.0, 100.0), (170.0, 120.0), (160.0, 110.0))):
        for target, tps, tpot in (("trtllm-forge", ours_tps, 40.0), ("llama.cpp", peer_tps, 50.0)):
            runs.append(
                {
                    "target": target,
                    "concurrency": 8,
                    "repeat": repeat,
                    "output_token_throughput_per_s": tps,
                    "ttft_ms_p50": 100.0,
                    "tpot_ms_p50": tpot,
                    "itl_ms_p99": 2 * tpot,
                }
            )
    runs.append({"target": "llama.cpp", "concurrency": 8, "repeat": 3, "error": "RuntimeError: boom"})
    document = _header(
        workload={"input_tokens": 64, "output_tokens": 64, "concurrency": [8], "requests": 16},
        llama_cpp={"version": "version: 1 (abc)"},
        runs=runs,
    )
    text = peer.render_table(document)
    assert "| 8 | trtllm-forge | 3 | 160.0 | 100.0 | 40.0 | 80.0 | 2.00 |" in text
    assert "| 8 | llama.cpp | 3 | 110.0 | 100.0 | 50.0 | 100.0 | 2.00 |" in text
    assert "tokens/s 1.45×" in text and "TPOT p50 0.80×" in text
    assert "1 failed runs" in text


def test_peer_points_never_repeat_a_prompt() -> None:
    """llama-server answers a prompt it has seen from its prompt cache: no point may reuse another's prompts."""
    import numpy as np

    from trtllm_forge.bench.specs import LengthSpec
    from trtllm_forge.bench.workload import synthetic

    peer = _script("bench_llamacpp_peer")
    points = [(repeat, concurrency) for repeat in range(3) for concurrency in (1, 8, 16)]
    seeds = [peer.prompt_seed(*point) for point in points]
    assert len(set(seeds)) == len(points)
    length = LengthSpec.parse("64", "--input-len")
    # The bench draws a point's prompts from default_rng([seed, point index]) (trtllm_forge/bench/run.py).
    prompts = [p.prompt for seed in seeds for p in synthetic(16, length, length, np.random.default_rng([seed, 0]))]
    assert len(set(prompts)) == len(prompts)


def test_batch1_report_says_whether_the_goal_is_met() -> None:
    batch1 = _script("bench_batch1_roofline")
    names = [v.name for v in batch1.VARIANTS]

    def point(variant: str, tok_s: float, roofline: float, nbytes: float) -> dict[str, Any]:
        return {
            "variant": variant,
            "tokens_per_s": tok_s,
            "roofline_tokens_per_s": roofline,
            "share_of_roofline": tok_s / roofline,
            "bandwidth_gb_s": 10.0,
            "effective_bandwidth_gb_s": nbytes * tok_s / 1e9,
            "step_ms_p50": 1000 / tok_s,
            "step_ms_min": 500 / tok_s,
            "roofline_bytes_per_step": nbytes,
        }

    points = [point(names[0], 40.0, 60.0, 5e8), point(names[1], 30.0, 50.0, 5e8), point(names[2], 80.0, 200.0, 1.5e8)]
    points.append(point(names[3], 36.0, 55.0, 5.4e8))
    text = batch1.render_report(_header(output_tokens=32, points=points))
    assert "40.0 tok/s, 67% of the roofline" in text and "misses the 80% goal" in text
    assert "int8 weights: 80.0 tok/s (2.00× fp32) for 3.33× fewer bytes" in text
    assert "A 960-token prompt: 36.0 tok/s (0.90×" in text
    assert "fastest step reaches 133% of the roofline" in text
    assert "stateful" not in text and "weights alone" not in text  # older result files have no such variants

    points += [point(names[4], 44.0, 60.0, 5e8), point(names[5], 50.0, 60.0, 4.9e8), point(names[7], 40.0, 60.0, 4.9e8)]
    points.append(point(names[8], 42.0, 60.0, 5e8))
    text = batch1.render_report(_header(output_tokens=32, points=points))
    assert "steps in 22.7 ms (0.91× the served pipeline's step)" in text
    assert "only the 490 MB of fp32 projections" in text and "takes 20.0 ms per step, 83% of the roofline" in text
    assert "the engine's step takes 5.0 ms (20%) longer" in text
    assert "TBB_PARTITIONER STATIC): 42.0 tok/s (1.05× the default)" in text
    assert "numpy's BLAS reads the same projections in 25.0 ms (19.60 GB/s effective, 1.25× OpenVINO's time)" in text


def test_batch1_floor_reads_the_models_weights() -> None:
    batch1 = _script("bench_batch1_roofline")
    smollm2 = {
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "head_dim": 64,
        "num_hidden_layers": 30,
        "vocab_size": 49152,
    }
    shapes = batch1.projection_shapes(smollm2)
    # SmolLM2-135M: 134.5M parameters, of which the token embedding (tied to lm_head) is read once, as lm_head
    assert len(shapes) == 30 * 7 + 1 and shapes[-1] == (576, 49152)
    assert sum(k * n for k, n in shapes) == 30 * (2 * 576 * 576 + 2 * 576 * 192 + 3 * 576 * 1536) + 576 * 49152


def test_profile_report_splits_the_step_by_node_type() -> None:
    profile = _script("bench_batch1_profile")

    def point(kind: str, repeat: int, nodes: dict[str, float], step_ms: float) -> dict[str, Any]:
        projection_ms = nodes.get("FullyConnected", 0.0) + nodes.get("MatMul", 0.0)
        return {
            "kind": kind,
            "repeat": repeat,
            "bandwidth_gb_s": 30.0,
            "step_ms_p50": step_ms,
            "node_ms_p50": nodes,
            "projection_ms": projection_ms,
            "projection_bytes": 5e8,
            "projection_gb_s": 5e8 / (projection_ms / 1e3) / 1e9,
        }

    small = {f"Op{i}": 0.1 for i in range(9)}  # nine small types: one past the eight rows shown
    points = [
        point("engine", 0, {"FullyConnected": 24.0, "MatMul": 1.0, "ScaledDotProductAttentionWithKVCache": 2.0, **small}, 29.0),
        point("engine", 1, {"FullyConnected": 26.0, "MatMul": 1.0, "ScaledDotProductAttentionWithKVCache": 2.0, **small}, 31.0),
        point("floor", 0, {"FullyConnected": 20.0}, 20.5),
        point("floor", 1, {"FullyConnected": 22.0}, 22.5),
    ]
    text = profile.render_profile(_header(prompt_tokens=64, decode_steps=32, points=points))
    assert "| FullyConnected | 25.00 | 87% |" in text  # median of 24 and 26, of 25 + 1 + 2 + 0.9
    assert "| ScaledDotProductAttentionWithKVCache | 2.00 | 7% |" in text
    assert "| 4 other node types | 0.40 | 1% |" in text and "| all nodes | 28.90 | 100% |" in text
    assert "2 runs" in text and "A decode step takes 30.0 ms (wall)" in text
    assert "take 26.0 ms (90%)" in text and "alone (the weight-reading floor model) take 21.0 ms at 23.9 GB/s" in text
    assert "takes 2.9 ms (10%)" in text


def test_concurrency_table_gives_cpu_per_token_and_what_it_allows() -> None:
    cpu = _script("bench_cpu_engine")

    def point(path: str, repeat: int, tok_s: float, cpu_s: dict[str, float] | None) -> dict[str, Any]:
        tokens = 1000
        return {
            "path": path,
            "concurrency": 16,
            "repeat": repeat,
            "requests": 32,
            "tokens": tokens,
            "seconds": tokens / tok_s,
            "tok_s": tok_s,
            "identical": 32,
            "errors": 0,
            **({"cpu_s": cpu_s} if cpu_s is not None else {}),
        }

    in_process = {"bench_process": 8.0, "tritonserver": 0.0, "engine_stub": 0.0, "other_stubs": 0.0}
    streamed = {"bench_process": 0.3, "tritonserver": 0.6, "engine_stub": 8.6, "other_stubs": 0.2}
    points = [point("in-process", 0, 250.0, in_process), point("served-stream", 0, 200.0, streamed), point("served", 0, 240.0, None)]
    document = _header(workload={"precision": "fp32", "prompts": 16, "max_tokens": 64, "concurrency": [16], "repeats": 1}, points=points)
    text = cpu.render_concurrency_table(document)
    assert "| 16 | engine in-process (ContinuousBatchingPipeline, same scheduler) | 250.0 | — | 8.00 / 0.00 / 0.00 | — | 32/32 |" in text
    # 8.6 engine + 0.8 serving + 0.3 client = 9.7 ms per token against 8.0 in process: 82%
    assert "| 16 | Triton ensemble, streamed | 200.0 | 80.0% (80) | 8.60 / 0.80 / 0.30 | 82% | 32/32 |" in text
    assert "| 16 | Triton ensemble, not streamed | 240.0 | 96.0% (96) | — | — | 32/32 |" in text  # an older file: no CPU record
    assert "MISS: concurrency 16, Triton ensemble, streamed >= 95% of in-process (80.0%)" in text


def test_fidelity_repeat_winners_compare_tools_inside_each_repeat() -> None:
    """The tools of one repeat ran interleaved: the winner is counted per repeat (smallest |TTFT error| against the
    server's stamps, most responses/s on the flood); a tool without server stamps, or alone in its repeat, is not counted."""
    fidelity = _script("bench_tools_fidelity")

    def run(tool: str, repeat: int, ttft: float | None, concurrency: int = 4) -> dict[str, Any]:
        reference = None if ttft is None else 40.0
        return {"tool": tool, "repeat": repeat, "concurrency": concurrency, "ttft_ms_p50": ttft or 41.0, "ref_ttft_ms_p50": reference}

    document = {
        "runs": [
            run("trtllm-forge", 0, 40.2),
            run("perf_analyzer", 0, 40.8),
            run("aiperf", 0, None),  # no server stamps: never counted
            run("trtllm-forge", 1, 40.9),
            run("perf_analyzer", 1, 39.7),  # -0.75%: the smallest |error| wins, not the smallest value
            run("genai-perf", 1, 41.0),
            run("trtllm-forge", 2, 40.4),
            run("perf_analyzer", 2, 40.5, concurrency=16),  # alone at its concurrency in repeat 2
            run("trtllm-forge", 0, 40.1, concurrency=16),
            run("perf_analyzer", 0, 40.3, concurrency=16),
        ],
        "flood": [
            {"tool": "trtllm-forge", "repeat": 0, "concurrency": 1, "responses_per_s": 1500.0},
            {"tool": "perf_analyzer", "repeat": 0, "concurrency": 1, "responses_per_s": 1400.0},
            {"tool": "trtllm-forge", "repeat": 1, "concurrency": 1, "responses_per_s": 1300.0},
            {"tool": "perf_analyzer", "repeat": 1, "concurrency": 1, "responses_per_s": 1350.0},
            {"tool": "perf_analyzer", "repeat": 2, "concurrency": 1, "error": "exit 1"},
        ],
    }
    accurate, fastest = fidelity.repeat_winners(document)
    assert accurate == "Most accurate TTFT p50 within each repeat: c=4: trtllm-forge 1, perf_analyzer 1 of 2; c=16: trtllm-forge 1 of 1."
    assert fastest == "Fastest flood consumer within each repeat: c=1: trtllm-forge 1, perf_analyzer 1 of 2."


def test_steal_share_is_the_hypervisors_part_of_the_machines_cpu_time() -> None:
    ticks = provenance.machine_cpu_ticks()  # this machine's /proc/stat
    assert ticks is not None and len(ticks) == 8 and all(t >= 0 for t in ticks)
    before = (100, 0, 50, 800, 0, 0, 0, 50)
    after = (130, 0, 60, 860, 0, 0, 0, 150)  # 200 ticks passed, 100 of them stolen
    assert provenance.steal_share(before, after) == 0.5
    assert provenance.steal_share(before, before) is None  # no time passed
    assert provenance.steal_share(None, after) is None


def test_fidelity_runs_again_a_run_the_hypervisor_stole_from(monkeypatch, tmp_path: Path) -> None:
    """A run with steal above STEAL_WARN_SHARE is kept in the file, marked, and run again (at most STEAL_RERUNS
    times; the last attempt counts whatever its steal); marked runs are in no comparison and the README says how many."""
    fidelity = _script("bench_tools_fidelity")
    steal = {"trtllm-forge": [0.20, 0.01], "perf_analyzer": [0.30, 0.40, 0.35]}
    rates = {"trtllm-forge": [900.0, 1500.0], "perf_analyzer": [800.0, 850.0, 1400.0]}

    def one_run(tool, urls, model, concurrency, n, osl, out, tokenizer):
        attempt = int(out.name.rsplit("-", 1)[1])
        return {
            "tool": tool,
            "model": model,
            "concurrency": concurrency,
            "responses_per_s": rates[tool][attempt],
            "steal_share": steal[tool][attempt],
        }

    monkeypatch.setattr(fidelity, "one_run", one_run)
    document: dict[str, Any] = {"repeats": 1, "flood": []}
    fidelity.interleaved(document, "flood", ["trtllm-forge", "perf_analyzer"], {}, "flood", [1], lambda c: 32, 256, tmp_path, None)
    assert [(r["tool"], "rerun" in r) for r in document["flood"]] == [
        ("trtllm-forge", True),
        ("trtllm-forge", False),
        ("perf_analyzer", True),
        ("perf_analyzer", True),
        ("perf_analyzer", False),  # out of reruns: counts, its steal shown
    ]
    compared = fidelity.compared_rows(document, "flood")
    assert [(r["tool"], r["responses_per_s"]) for r in compared] == [("trtllm-forge", 1500.0), ("perf_analyzer", 1400.0)]
    assert fidelity.repeat_winners(document) == ["Fastest flood consumer within each repeat: c=1: trtllm-forge 1 of 1."]
    table = "\n".join(fidelity.flood_table(document))
    assert "| 1 | trtllm-forge | 1 | 1,500 |" in table and table.splitlines()[-1].endswith("| 35.0% |")
