"""The LLM API path without a server: `run --dry-run` over every shipped config (refusing checkpoints that are not
here), the LLM-API argument check, the typed build hand-off and the CPU llmapi repository layout."""

from __future__ import annotations

import json

import pytest
import yaml
from cli_inprocess import run_in_process
from conftest import CONFIGS

from trtllm_forge.llmapi_args import TOP_LEVEL, unknown_keys
from trtllm_forge.stage_results import BuildResult
from trtllm_forge.stages import StageResult

SHIPPED = sorted(CONFIGS.glob("*.yaml"))


def _with_public_checkpoint(config_file, tmp_path):
    """A GPU example whose checkpoints are folders here holding the public config.json shape (catalog), so the
    dry run has what it reads; CPU examples are used as shipped."""
    from trtllm_forge.model_shape import model_catalog

    data = yaml.safe_load(config_file.read_text())
    if data["model"]["source"].startswith("/"):
        for section, key, model_id in (("model", "source", data["model"].get("name")), ("engine.speculative", "draft_model", None)):
            holder = data
            for part in section.split("."):
                holder = holder.get(part, {})
            if not holder.get(key):
                continue
            folder = tmp_path / "models" / key
            folder.mkdir(parents=True)
            (folder / "config.json").write_text(json.dumps(model_catalog().get(model_id or "", {})))
            for name in ("model.safetensors", "tokenizer.json"):  # named only: the dry run reads neither
                (folder / name).write_bytes(b"")
            holder[key] = str(folder)
    path = tmp_path / config_file.name
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("config_file", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_run_dry_run_prints_the_whole_plan(config_file, tmp_path):
    config = _with_public_checkpoint(config_file, tmp_path)
    proc = run_in_process("run", str(config), "--dry-run", "--workdir", str(tmp_path / "wd"))
    assert proc.returncode == 0, proc.stderr
    for step in ("1. import", "2. build", "trtllm-forge render", "trtllm-forge deploy", "trtllm-forge verify", "deploy stop"):
        assert step in proc.stderr, step
    assert not (tmp_path / "wd").exists() or not any((tmp_path / "wd").iterdir())


@pytest.mark.parametrize("field", ["model.source", "engine.speculative.draft_model"])
def test_dry_run_refuses_a_checkpoint_that_is_not_here(tmp_path, field):
    source = yaml.safe_load((CONFIGS / "llama3.1-8b-fp8-h100.yaml").read_text())
    source["engine"]["target"] = "llmapi"
    present = tmp_path / "present"
    present.mkdir()
    source["model"]["source"] = str(present)
    section, key = field.rsplit(".", 1)
    holder = source
    for part in section.split("."):
        holder = holder[part]
    holder[key] = "/models/not-on-this-machine"
    path = tmp_path / "gpu-llmapi.yaml"
    path.write_text(yaml.safe_dump(source))
    proc = run_in_process("run", str(path), "--dry-run", "--json", "--workdir", str(tmp_path / "wd"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"{path}: {field}: /models/not-on-this-machine does not exist on this machine" in proc.stderr


def test_unknown_llm_api_option_is_one_line_with_the_nearest_key(tmp_path):
    source = yaml.safe_load((CONFIGS / "smollm2-cpu-llmapi.yaml").read_text())
    source["engine"]["extra_llm_api_options"] = {"kv_cache_config": {"enable_block_resue": True}}
    path = tmp_path / "typo.yaml"
    path.write_text(yaml.safe_dump(source))
    proc = run_in_process("run", str(path), "--dry-run", "--workdir", str(tmp_path / "wd"))
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in proc.stderr
    assert "kv_cache_config.enable_block_resue" in lines[0] and "kv_cache_config.enable_block_reuse" in lines[0]


def test_argument_table_knows_nvidia_fields_and_finds_typos():
    assert {
        "model",
        "kv_cache_config",
        "scheduler_config",
        "speculative_config",
        "cuda_graph_config",
        "max_num_tokens",
        "enable_chunked_prefill",
        "stream_interval",
    } <= TOP_LEVEL
    assert [(p.key, p.near) for p in unknown_keys({"max_num_token": 8})] == [("max_num_token", "max_num_tokens")]
    assert unknown_keys({"scheduler_config": {"capacity_scheduler_policy": "MAX_UTILIZATION"}}) == []
    assert unknown_keys({"triton_config": {}})[0].key == "triton_config"
    assert unknown_keys({"triton_config": {}}, model_yaml=True) == []


# Read from NVIDIA's files by hand (2026-12-02), independently of the table: TorchLlmArgs' own fields in the 1.1-era
# tensorrt_llm/llmapi/llm_args.py, and KvCacheConfig's fields in the 1.3.0rc7 API reference.
TORCH_FIELDS_1_1_ERA = {
    "build_config", "garbage_collection_gen0_threshold", "cuda_graph_config", "attention_dp_config", "disable_overlap_scheduler",
    "moe_config", "attn_backend", "sampler_type", "enable_iter_perf_stats", "enable_iter_req_stats", "print_iter_log",
    "perf_metrics_max_requests", "batch_wait_timeout_ms", "batch_wait_timeout_iters", "batch_wait_max_tokens_ratio",
    "torch_compile_config", "enable_autotuner", "enable_layerwise_nvtx_marker", "load_format", "enable_min_latency",
    "stream_interval", "force_dynamic_quantization", "allreduce_strategy", "checkpoint_loader", "checkpoint_format",
    "kv_connector_config", "mm_encoder_only", "ray_worker_extension_cls",
}  # fmt: skip
KV_CACHE_CONFIG_1_3_0RC7 = {
    "enable_block_reuse", "max_tokens", "max_attention_window", "sink_token_length", "free_gpu_memory_fraction",
    "host_cache_size", "onboard_blocks", "cross_kv_cache_fraction", "secondary_offload_min_priority", "event_buffer_max_size",
    "attention_dp_events_gather_period_ms", "enable_partial_reuse", "copy_on_partial_reuse", "use_uvm", "max_gpu_total_bytes",
    "dtype", "mamba_ssm_cache_dtype", "tokens_per_block", "use_kv_cache_manager_v2", "max_util_for_resume",
}  # fmt: skip


def test_argument_tables_name_their_sources_and_are_bracketed_by_nvidias_files():
    from trtllm_forge.llmapi_args import AFTER_1_1, NESTED, SOURCES

    assert set(SOURCES) == {"top_level", *NESTED}
    for table, provenance in SOURCES.items():
        assert provenance.sources and provenance.note, table
        assert all(s.repository and s.ref and s.path for s in provenance.sources), table
        assert provenance.uncertain, f"{table}: no 1.2.x-tagged llm_args.py is stored, so no table can claim certainty"
    assert TORCH_FIELDS_1_1_ERA <= TOP_LEVEL  # nothing the earlier bracket accepts is refused
    assert not AFTER_1_1 & TORCH_FIELDS_1_1_ERA and AFTER_1_1 <= TOP_LEVEL
    assert NESTED["kv_cache_config"] == KV_CACHE_CONFIG_1_3_0RC7 - {"use_kv_cache_manager_v2", "max_util_for_resume"}
    assert unknown_keys({"build_config": {}, "ray_worker_nsight_options": {}}) == []


def test_build_result_reads_both_build_targets(tmp_path):
    llmapi = StageResult("build", tmp_path, False, {"outputs": {"target": "llmapi", "llmapi_dir": str(tmp_path / "llmapi")}})
    engine = StageResult("build", tmp_path, True, {"outputs": {"engine_dir": str(tmp_path / "engine")}})
    a, b = BuildResult.from_stage(llmapi), BuildResult.from_stage(engine)
    assert (a.target, a.engine_dir, a.model_yaml) == ("llmapi", None, tmp_path / "llmapi" / "model.yaml")
    assert (b.target, b.engine_dir, b.skipped) == ("engine", tmp_path / "engine", True)
    assert isinstance(a, StageResult)


def test_gpu_llmapi_render_has_no_shim_and_cpu_render_names_the_stand_in(tmp_path):
    from trtllm_forge.config import load_config
    from trtllm_forge.render.other_kinds import write_llmapi_repository

    cpu = load_config(CONFIGS / "smollm2-cpu-llmapi.yaml")
    engine_dir = tmp_path / "engine"
    engine_dir.mkdir()
    _files, warnings = write_llmapi_repository(cpu, tmp_path / "wd", tmp_path / "cpu", engine_dir)
    version = tmp_path / "cpu" / "tensorrt_llm" / "1"
    shim = (version / "tensorrt_llm" / "__init__.py").read_text()
    assert "NOT TensorRT-LLM" in shim and "trtllm_forge.llmapi_cpu" in shim
    assert any("stand-in" in w for w in warnings)
    body = yaml.safe_load((version / "model.yaml").read_text())
    assert body["model"] == str(engine_dir.resolve())
    assert unknown_keys(body, model_yaml=True) == []
    template = (CONFIGS.parent / "model_repo_templates" / "llmapi" / "tensorrt_llm" / "model.py").read_text()
    assert (version / "model.py").read_text() == template  # the same model.py as on GPU

    gpu_source = yaml.safe_load((CONFIGS / "llama3.1-8b-fp8-h100.yaml").read_text())
    gpu_source["engine"]["target"] = "llmapi"
    gpu_file = tmp_path / "gpu.yaml"
    gpu_file.write_text(yaml.safe_dump(gpu_source))
    gpu = load_config(gpu_file)
    write_llmapi_repository(gpu, tmp_path / "wd", tmp_path / "gpu")
    assert not (tmp_path / "gpu" / "tensorrt_llm" / "1" / "tensorrt_llm").exists()
