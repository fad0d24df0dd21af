"""`tune`'s parts on real configs, without a server: the SLO and space parsers and their refusals, feasibility with
its reasons, the model's ranking, successive halving over recorded results, the trial cache and a failing trial,
the best config's YAML, and what `--emit` writes. The real tune (servers, benches) is in test_tune_live.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_inprocess import run_in_process

from trtllm_forge.config import load_config
from trtllm_forge.errors import ConfigError
from trtllm_forge.tune.config_file import config_yaml
from trtllm_forge.tune.feasibility import apply_point, check_point, check_space
from trtllm_forge.tune.rank import arrivals, predict, rank
from trtllm_forge.tune.report import pareto_front, spearman
from trtllm_forge.tune.search import Rung, rungs, successive_halving
from trtllm_forge.tune.slo import parse_slo, point_goodput
from trtllm_forge.tune.space import default_point, default_space, grid, read_space
from trtllm_forge.tune.trials import TRIAL_FILE, BenchPlan, TrialResult, run_trial, trial_key, trials_dir

REPO = Path(__file__).resolve().parent.parent
CPU_CONFIG = REPO / "configs" / "smollm2-cpu.yaml"
GPU_CONFIG = REPO / "configs" / "llama3.1-8b-fp8-h100.yaml"
SLO = "ttft_p99_ms=2000,tpot_p50_ms=200"


@pytest.fixture(scope="module", autouse=True)
def measured_host(tmp_path_factory):
    """A measured 2-core host profile (what `plan --measure-host` wrote on this VM) for the model's CPU roofline:
    the session's user cache has none, and measuring takes seconds."""
    from trtllm_forge.hardware import HOST_PROFILE_ENV, hardware_table

    path = tmp_path_factory.mktemp("host") / "hardware-cpu.json"
    path.write_text(json.dumps({"memory_gb": 23.5, "bandwidth_gb_s": 7.3, "fp32_tflops": 0.23, "measured_at": "2026-12-05T00:11:32+00:00"}))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(HOST_PROFILE_ENV, str(path))
        hardware_table.cache_clear()
        yield path
    hardware_table.cache_clear()


@pytest.fixture(scope="module")
def cpu_config():
    return load_config(CPU_CONFIG)


def _one_error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    return lines[0]


def test_slo_parses_goals_and_per_request_limits():
    slo = parse_slo("ttft_p99_ms=500, tpot_p50_ms=50,e2e_max_ms=9000,itl_p95_ms=80")
    assert [g.name for g in slo.goals] == ["ttft_p99_ms", "tpot_p50_ms", "e2e_max_ms", "itl_p95_ms"]
    assert slo.per_request_ms() == {"ttft": 500.0, "tpot": 50.0, "e2e": 9000.0}  # itl has no per-request limit
    summary = {"metrics": {"ttft_ms": {"p99": 450.0}, "tpot_ms": {"p50": 60.0}, "e2e_ms": {"max": 10.0}, "itl_ms": {"p95": 5.0}}}
    assert slo.misses(summary) == ["tpot_p50_ms 60 > 50"]


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("ttft_p99=500", "'ttft_p99=500' is not METRIC_STAT_ms=LIMIT"),
        ("latency_p99_ms=5", "unknown metric 'latency'"),
        ("ttft_p42_ms=5", "unknown statistic 'p42'"),
        ("ttft_p99_ms=fast", "'fast' is not a number"),
        ("ttft_p99_ms=-1", "positive number"),
        ("ttft_p99_ms=1,ttft_p99_ms=2", "given twice"),
    ],
)
def test_bad_slo_exits_2_naming_the_part(text, named):
    with pytest.raises(ConfigError) as caught:
        parse_slo(text)
    assert named in caught.value.format_message()
    out = run_in_process("tune", str(CPU_CONFIG), "--slo", text, "--dry-run")
    assert out.returncode == 2
    line = _one_error_line(out.stderr)
    assert line.startswith("error: --slo:") and named in line


def test_goodput_counts_good_requests_and_drops_a_point_missing_a_statistic():
    slo = parse_slo("ttft_p99_ms=500")
    summary = {"metrics": {"ttft_ms": {"p99": 400.0}, "goodput_per_s": {"avg": 3.0}, "output_tokens": {"avg": 32.0}}}
    assert point_goodput(slo, summary, "tokens") == 96.0
    assert point_goodput(slo, summary, "requests") == 3.0
    summary["metrics"]["ttft_ms"]["p99"] = 600.0
    assert point_goodput(slo, summary, "tokens") == 0.0


def test_default_space_has_the_cpu_engine_and_triton_knobs(cpu_config):
    names = [k.name for k in default_space(cpu_config)]
    assert names == [
        "engine.max_batch_size",
        "engine.max_num_tokens",
        "runtime.max_tokens_in_paged_kv_cache",
        "runtime.arrival_window_ms",
        "triton.instances.preprocessing",
        "triton.instances.postprocessing",
    ]
    knobs = {k.name: k for k in default_space(cpu_config)}
    assert knobs["engine.max_batch_size"].values == (8, 16, 32)  # around the config's 16
    assert knobs["engine.max_batch_size"].stage == "build" and knobs["runtime.arrival_window_ms"].stage == "render"
    gpu = [k.name for k in default_space(load_config(GPU_CONFIG))]
    assert {"runtime.kv_cache_free_gpu_mem_fraction", "parallel.tp", "parallel.pp"} <= set(gpu)
    dynamo = [k.name for k in default_space(load_config(REPO / "configs" / "llama3.1-8b-fp8-h100-dynamo-disagg.yaml"))]
    assert {"deploy.dynamo.disaggregated", "deploy.dynamo.prefill_workers", "deploy.dynamo.decode_workers"} <= set(dynamo)


def test_space_file_narrows_widens_and_refuses_unknown_knobs(cpu_config, tmp_path):
    space = tmp_path / "space.yaml"
    space.write_text("engine.max_batch_size: [4, 64]\ntriton.instances.preprocessing: [1]\ntriton.instances.tensorrt_llm: [1, 2]\n")
    knobs = {k.name: k.values for k in read_space(space, cpu_config)}
    assert knobs["engine.max_batch_size"] == (4, 64)
    assert knobs["triton.instances.preprocessing"] == (1,)
    assert knobs["triton.instances.tensorrt_llm"] == (1, 2)  # a knob the default space leaves fixed
    assert knobs["engine.max_num_tokens"] == (1024, 2048, 4096)  # unnamed: the default's
    space.write_text("engine.max_batch_sise: [4]\n")
    out = run_in_process("tune", str(CPU_CONFIG), "--slo", SLO, "--space", str(space), "--dry-run")
    assert out.returncode == 2
    line = _one_error_line(out.stderr)
    assert str(space) in line and "engine.max_batch_sise: unknown knob" in line and "engine.max_batch_size" in line
    out = run_in_process("tune", str(CPU_CONFIG), "--slo", SLO, "--space", str(tmp_path / "none.yaml"), "--dry-run")
    assert out.returncode == 2 and _one_error_line(out.stderr).startswith("error: --space:")
    space.write_text("engine.max_batch_size: 4\n")
    out = run_in_process("tune", str(CPU_CONFIG), "--slo", SLO, "--space", str(space), "--dry-run")
    assert out.returncode == 2 and "engine.max_batch_size: 4 is not a list of values" in _one_error_line(out.stderr)


def test_feasibility_prunes_with_the_reason(cpu_config):
    small_kv = check_point(cpu_config, {"runtime.max_tokens_in_paged_kv_cache": 1024})
    assert not small_kv.feasible and "memory" in small_kv.reasons[0] and "max_tokens_in_paged_kv_cache" in small_kv.reasons[0]
    schema = check_point(cpu_config, {"engine.max_batch_size": 0})
    assert not schema.feasible and schema.reasons[0].startswith("engine.max_batch_size:")
    repeat = check_point(cpu_config, {"engine.max_num_tokens": 512})
    assert not repeat.feasible and "raises it to max_input_len" in repeat.reasons[0]
    fine = check_point(cpu_config, {"engine.max_batch_size": 8})
    assert fine.feasible and fine.config is not None and fine.config.engine.max_batch_size == 8
    gpu = load_config(GPU_CONFIG)
    feasible, pruned = check_space(gpu, grid(default_space(gpu)))
    assert feasible and pruned  # NVIDIA's lint (max_num_tokens vs max_seq_len) and EAGLE's limits prune some
    assert any("max_num_tokens" in reason for c in pruned for reason in c.reasons)


def test_a_space_without_a_feasible_point_exits_2_with_the_nearest(tmp_path):
    space = tmp_path / "space.yaml"
    space.write_text("runtime.max_tokens_in_paged_kv_cache: [256, 1024]\nengine.max_batch_size: [16]\n")
    out = run_in_process("tune", str(CPU_CONFIG), "--slo", SLO, "--space", str(space), "--dry-run")
    assert out.returncode == 2
    line = _one_error_line(out.stderr)
    assert "no feasible point among 48" in line and "the config with max_tokens_in_paged_kv_cache=1024 " in line
    assert "ruled out by memory" in line


def test_ranking_follows_the_serving_model(cpu_config):
    from trtllm_forge.plan.planner import default_workload, make_plan
    from trtllm_forge.plan.serving_model import predict_serving

    slo = parse_slo("ttft_p99_ms=100000,tpot_p50_ms=100000")  # every load meets it: the ranking is throughput's
    points = [{"engine.max_batch_size": 1}, {"engine.max_batch_size": 8}]
    feasible, _ = check_space(cpu_config, points)
    ranked = rank(feasible, slo, [8], "tokens", default_point(cpu_config, default_space(cpu_config)))
    assert [r.checked.point["engine.max_batch_size"] for r in ranked] == [8, 1]
    trial = apply_point(cpu_config, {"engine.max_batch_size": 8})
    model = predict_serving(make_plan(trial, default_workload(trial)), concurrency=8, instances=1, arrivals="waves")
    assert model is not None
    assert ranked[0].predicted.goodput == pytest.approx(model.output_tokens_per_s)
    assert arrivals(trial) == "waves"  # one prompt and one output length: the trial's bench keeps the batch in step
    strict = predict(trial, parse_slo("tpot_p50_ms=0.001"), [8], "tokens")
    assert strict.goodput == 0.0 and strict.tpot_ms == pytest.approx(model.tpot_ms)


def test_rungs_fit_the_budget():
    assert [(r.candidates, r.num_requests) for r in rungs(30, 8, 8)] == [(4, 8), (2, 16), (1, 32)]
    assert [(r.candidates, r.num_requests) for r in rungs(2, 8, 4)] == [(2, 4), (1, 8)]
    assert sum(r.candidates for r in rungs(30, 12, 8)) <= 12
    assert rungs(0, 8, 8) == []


def test_successive_halving_on_recorded_results():
    recorded = {("a", 0): 10.0, ("b", 0): 30.0, ("c", 0): None, ("d", 0): 20.0, ("b", 1): 25.0, ("d", 1): 28.0, ("d", 2): 27.0}
    asked: list[tuple[str, int]] = []

    def measure(candidate: str, rung: Rung) -> float | None:
        asked.append((candidate, rung.index))
        return recorded[(candidate, rung.index)]

    plan = rungs(5, 7, 4)
    outcome = successive_halving(["a", "b", "c", "d", "e"], plan, measure)
    # rung 0: the 4 best-ranked; b and d survive (c failed); rung 1: d beats b; rung 2: d alone.
    assert asked == [("a", 0), ("b", 0), ("c", 0), ("d", 0), ("b", 1), ("d", 1), ("d", 2)]
    assert outcome.best == "d" and outcome.best_goodput == 27.0 and outcome.trials == 7 and outcome.stopped is None
    ticks = iter([0.0, 0.0, 100.0])
    stopped = successive_halving(["a", "b", "c", "d"], plan, measure, deadline=50.0, clock=lambda: next(ticks))
    assert stopped.trials == 2 and stopped.stopped and stopped.best == "b"


def test_spearman_and_pareto():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [40, 30, 20, 10]) == pytest.approx(-1.0)
    assert spearman([1, 2], [1, 2]) is None and spearman([1, 1, 1], [1, 2, 3]) is None
    assert pareto_front([(1, 10), (2, 8), (3, 9), (4, 1)]) == [(1, 10), (3, 9), (4, 1)]


def test_a_finished_trial_is_read_not_rerun(cpu_config, tmp_path):
    bench, slo = BenchPlan((1,), 4), parse_slo(SLO)
    key = trial_key(cpu_config, bench, slo)
    recorded = TrialResult(key, {"engine.max_batch_size": 16}, "done", 42.0, bench.to_dict(), directory="x")
    (trials_dir(tmp_path) / key).mkdir(parents=True)
    (trials_dir(tmp_path) / key / TRIAL_FILE).write_text(json.dumps(recorded.to_dict()))
    # No import, build or server in tmp_path: running the trial would take minutes, reading it none.
    result = run_trial(cpu_config, {"engine.max_batch_size": 16}, bench, slo, "tokens", tmp_path)
    assert result.cached and result.goodput == 42.0
    assert not (tmp_path / "import").exists()
    assert trial_key(cpu_config, BenchPlan((1,), 8), slo) != key  # a longer bench is another trial


def test_a_crashing_trial_is_recorded_failed_with_its_log(tmp_path):
    config_file = tmp_path / "gone.yaml"
    config_file.write_text(CPU_CONFIG.read_text().replace("source: smollm2-135m", f"source: {tmp_path / 'no-such-checkpoint'}"))
    config = load_config(config_file)
    bench, slo = BenchPlan((1,), 4), parse_slo(SLO)
    workdir = tmp_path / "wd"
    result = run_trial(config, {}, bench, slo, "tokens", workdir)
    assert result.status == "failed" and result.goodput == 0.0 and "no-such-checkpoint" in (result.error or "")
    kept = json.loads((Path(result.directory) / TRIAL_FILE).read_text())
    assert kept["status"] == "failed" and (Path(result.directory) / "config.yaml").is_file()
    again = run_trial(config, {}, bench, slo, "tokens", workdir)
    assert again.cached and again.status == "failed"


def test_best_config_yaml_is_a_config_run_accepts(cpu_config, tmp_path):
    point = {"engine.max_batch_size": 8, "runtime.arrival_window_ms": 0, "triton.instances.postprocessing": 2}
    path = tmp_path / "elsewhere" / "best.yaml"
    path.parent.mkdir()
    path.write_text(config_yaml(apply_point(cpu_config, point), "best"))
    out = run_in_process("config", "validate", str(path))
    assert out.returncode == 0, out.stderr
    loaded = load_config(path)
    assert loaded.engine.max_batch_size == 8 and loaded.runtime.arrival_window_ms == 0 and loaded.triton.instances.postprocessing == 2
    assert loaded.model_dump(exclude={"engine", "runtime", "triton"}) == cpu_config.model_dump(exclude={"engine", "runtime", "triton"})


def test_dry_run_prints_the_plan_and_writes_nothing(tmp_path):
    out = run_in_process("tune", str(CPU_CONFIG), "--slo", SLO, "--dry-run", "--json", "--workdir", str(tmp_path / "wd"))
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert len(doc["feasible"]) + len(doc["pruned"]) == len(grid(default_space(load_config(CPU_CONFIG))))
    assert doc["ranking"][0]["predicted"]["source"] == "serving model"
    assert doc["rungs"][0]["candidates"] >= 2 and any("trtllm-forge bench" in c for c in doc["commands"])
    assert not (tmp_path / "wd").exists()


def test_emit_writes_configs_and_one_script(tmp_path):
    space = tmp_path / "space.yaml"
    space.write_text("engine.max_batch_size: [8, 16]\nengine.max_num_tokens: [2048]\nruntime.max_tokens_in_paged_kv_cache: [32768]\n"
                     "runtime.arrival_window_ms: [0]\ntriton.instances.preprocessing: [1]\ntriton.instances.postprocessing: [1]\n")  # fmt: skip
    emit_dir = tmp_path / "emit"
    out = run_in_process("tune", str(GPU_CONFIG), "--slo", SLO, "--concurrency", "1,64", "--emit", str(emit_dir), "--trials", "4", "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert len(doc["trials"]) == 4 and sum(t["default"] for t in doc["trials"]) == 1
    script = (emit_dir / "run_trials.sh").read_text()
    assert "set -euo pipefail" in script and script.count("\nrun_trial ") == 4
    for trial in doc["trials"]:
        emitted = load_config(emit_dir / "trials" / trial["hash"] / "config.yaml")
        assert emitted.bench.workloads[0].slo_ms == {"ttft": 2000.0, "tpot": 200.0}
        assert emitted.bench.workloads[0].concurrency == [1, 64]
    missing = run_in_process("tune", str(GPU_CONFIG), "--import", str(emit_dir))
    assert missing.returncode == 2 and "no results" in _one_error_line(missing.stderr)


def test_report_sets_predictions_beside_measurements():
    from trtllm_forge.tune.rank import Predicted
    from trtllm_forge.tune.report import Row, report_document

    def row(goodput: float, predicted: float, simulated: float, default: bool = False) -> Row:
        trial = TrialResult(f"h{goodput:g}", {"engine.max_batch_size": int(goodput)}, "done", goodput, {"num_requests": 8})
        aic = {"status": "simulated", "values": {"tokens_per_s": simulated}}
        return Row(trial, Predicted(predicted, 8, 1.0, 1.0, predicted, "concurrency", "serving model"), 1, default, aic)

    rows = [row(10, 1, 30), row(20, 2, 20), row(30, 3, 10), row(5, 0.5, 40, default=True)]
    doc = report_document(rows, rows[2], rows[3], parse_slo(SLO), "tokens", {})
    assert doc["gain_over_default"] == pytest.approx(30 / 5)
    assert doc["model_rank_correlation"] == pytest.approx(1.0)  # the default is not one of the ranked points
    assert doc["aiconfigurator_rank_correlation"] == pytest.approx(-1.0)  # over every simulated trial
    assert [t["predicted"]["goodput"] for t in doc["trials"]] == [1, 2, 3, 0.5]
