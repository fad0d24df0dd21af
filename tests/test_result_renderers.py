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

    from trtllm_forge.bench.workload import LengthSpec, synthetic

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
    assert "spends the other 5.0 ms (20%) on attention" in text
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
