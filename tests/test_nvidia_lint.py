"""NVIDIA's LLM-API validators as lint (trtllm_forge/config/nvidia_lint.py): each rule on the arguments it reads,
`config validate` reporting every broken one at once with file:line, and every example config and the LLM-API
arguments rendered from it passing."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from cli_inprocess import run_in_process
from trtllm_forge.builders.tensorrt_llm import llmapi
from trtllm_helpers import REPO

from trtllm_forge.config import nvidia_lint
from trtllm_forge.config.checks import check_config
from trtllm_forge.config.load import load_config
from trtllm_forge.errors import ConfigErrors
from trtllm_forge.hardware import find_device

EXAMPLES = sorted((REPO / "configs").glob("*.yaml"))
LLMAPI_EXAMPLE = REPO / "configs" / "llama3.1-8b-fp8-h100.yaml"


def _problems(options: dict) -> list[str]:
    return [f"{p.where}: {p.problem}" for p in nvidia_lint.lint_options(options)]


# --- each rule on LLM-API arguments ---------------------------------------------------------------------------


def test_cuda_graph_sizes_above_max_batch_size_with_duplicates_are_refused():
    """The shape AIConfigurator 0.12 wrote (SemiAnalysisAI/InferenceX#2596): sizes past max_batch_size, repeated."""
    options = {"max_batch_size": 64, "cuda_graph_config": {"batch_sizes": [1, 2, 4, 64, 128, 256, 256]}}
    found = _problems(options)
    assert any("256 more than once" in p for p in found), found
    assert any("128, 256 above max_batch_size 64" in p for p in found), found
    assert all(p.startswith("cuda_graph_config.batch_sizes") for p in found)
    assert _problems({"max_batch_size": 64, "cuda_graph_config": {"batch_sizes": [1, 2, 4, 64], "enable_padding": True}}) == []


def test_cuda_graph_max_batch_size_must_match_the_sizes_nvidia_derives_it_from():
    found = _problems({"max_batch_size": 64, "cuda_graph_config": {"batch_sizes": [1, 8, 16], "max_batch_size": 32}})
    assert found == [
        "cuda_graph_config.max_batch_size: 32 differs from max(batch_sizes) 16 "
        "(NVIDIA/TensorRT-LLM tensorrt_llm/llmapi/llm_args.py CudaGraphConfig.validate_cuda_graph_config)"
    ]
    assert _problems({"max_batch_size": 64, "cuda_graph_config": {"max_batch_size": 128}})[0].startswith(
        "cuda_graph_config.max_batch_size: 128 is above max_batch_size 64"
    )


def test_max_num_tokens_must_hold_a_prompt_unless_prefill_is_chunked():
    short = {"max_num_tokens": 4096, "max_seq_len": 8192, "enable_chunked_prefill": False}
    assert _problems(short) == [
        "max_num_tokens: 4096 tokens per step cannot prefill a prompt of up to max_seq_len 8192 tokens without chunked prefill"
    ]
    assert _problems({**short, "enable_chunked_prefill": True}) == []
    assert _problems({**short, "max_num_tokens": 8192}) == []


def test_kv_fraction_and_byte_cap():
    h100 = find_device("H100-SXM")
    assert h100 is not None
    device_bytes = h100.memory_gb * nvidia_lint.DEVICE_MEMORY_UNIT
    over = {"kv_cache_config": {"free_gpu_memory_fraction": 0.9, "max_gpu_total_bytes": int(device_bytes) + 1}}
    found = nvidia_lint.lint_options(over, device_bytes=device_bytes)
    assert len(found) == 1 and "never binds" in found[0].problem and "#2773" in found[0].problem
    assert nvidia_lint.lint_options({"kv_cache_config": {"max_gpu_total_bytes": 20 * 1024**3}}, device_bytes=device_bytes) == []
    bad = _problems({"kv_cache_config": {"free_gpu_memory_fraction": 1.5, "max_gpu_total_bytes": -1}})
    assert bad == [
        "kv_cache_config.free_gpu_memory_fraction: 1.5 is outside (0, 1]",
        "kv_cache_config.max_gpu_total_bytes: -1 is not a byte count",
    ]


def test_moe_expert_times_tensor_parallel_is_the_tensor_parallel_size():
    assert _problems({"tensor_parallel_size": 8, "moe_expert_parallel_size": 4, "moe_tensor_parallel_size": 4})[0].startswith(
        "moe_expert_parallel_size: moe_expert_parallel_size 4 x moe_tensor_parallel_size 4 is not tensor_parallel_size 8"
    )
    assert _problems({"tensor_parallel_size": 8, "moe_expert_parallel_size": 4, "moe_tensor_parallel_size": 2}) == []


def test_disaggregated_pair_needs_one_transceiver_with_a_timeout():
    """TensorRT-LLM#18388 (different transceivers), #15152 and #14856 (no transfer timeout)."""
    good = {"cache_transceiver_config": {"backend": "DEFAULT", "kv_transfer_timeout_ms": 60000}}
    assert nvidia_lint.disaggregated_pair(good, dict(good)) == []
    other = {"cache_transceiver_config": {"backend": "UCX", "kv_transfer_timeout_ms": 60000}}
    found = nvidia_lint.disaggregated_pair(good, other)
    assert len(found) == 1 and "#18388" in found[0].problem
    untimed = {"cache_transceiver_config": {"backend": "DEFAULT"}}
    found = nvidia_lint.disaggregated_pair(untimed, untimed)
    assert [p.where for p in found] == [
        "prefill.cache_transceiver_config.kv_transfer_timeout_ms",
        "decode.cache_transceiver_config.kv_transfer_timeout_ms",
    ]
    assert [p.where for p in nvidia_lint.disaggregated_pair({}, {})] == [
        "prefill.cache_transceiver_config",
        "decode.cache_transceiver_config",
    ]


def test_every_rule_names_nvidias_source():
    rules = [*nvidia_lint.LINTS.values(), nvidia_lint.transceiver_timeout_set, nvidia_lint.disaggregated_pair]
    for rule in rules:
        doc = rule.__doc__ or ""
        assert re.search(r"llm_args\.py|mapping\.py|TensorRT-LLM#\d+|InferenceX#\d+", doc), rule.__name__


# --- on configs: config validate, the examples, the rendered arguments ----------------------------------------


def test_config_validate_reports_every_broken_rule_at_once_with_file_and_line(tmp_path):
    data = yaml.safe_load(LLMAPI_EXAMPLE.read_text())
    data["engine"]["max_num_tokens"] = 4096
    data["engine"]["extra_llm_api_options"] = {
        "cuda_graph_config": {"batch_sizes": [1, 2, 64, 128, 128]},
        "kv_cache_config": {"max_gpu_total_bytes": 10**12},
    }
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    result = run_in_process("config", "validate", str(path))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    text = path.read_text().splitlines()

    def line_of(needle: str) -> int:
        return next(i for i, line in enumerate(text, 1) if needle in line)

    expected = {
        "engine.max_num_tokens": line_of("max_num_tokens: 4096"),
        "engine.extra_llm_api_options.cuda_graph_config.batch_sizes": line_of("batch_sizes:"),
        "engine.extra_llm_api_options.kv_cache_config.max_gpu_total_bytes": line_of("max_gpu_total_bytes:"),
    }
    for field, line in expected.items():
        assert any(f"{path}:{line}" in e and field in e for e in errors), (field, line, errors)
    assert len([e for e in errors if "batch_sizes" in e]) == 2  # the duplicate and the sizes above 64


def test_a_disaggregated_graph_is_refused_when_its_rendered_transceivers_break_nvidias_rules(tmp_path):
    """The Dynamo graph's prefill and decode arguments pass disaggregated_pair; a user transceiver without a timeout
    keeps forge's default timeout, one with a null timeout is refused before anything is written (#15152)."""
    from trtllm_forge.deploy.dynamo_graph import render_dynamo_graph

    config = load_config(REPO / "configs" / "llama3.1-8b-fp8-h100-dynamo-disagg.yaml")
    render_dynamo_graph(config, tmp_path / "ok")  # the example renders
    broken_options = {**config.engine.extra_llm_api_options, "cache_transceiver_config": {"kv_transfer_timeout_ms": None}}
    broken = config.model_copy(update={"engine": config.engine.model_copy(update={"extra_llm_api_options": broken_options})})
    with pytest.raises(ConfigErrors) as refused:
        render_dynamo_graph(broken, tmp_path / "broken")
    assert [e.where for e in refused.value.errors] == [
        "prefill.engine.extra_llm_api_options.cache_transceiver_config.kv_transfer_timeout_ms",
        "decode.engine.extra_llm_api_options.cache_transceiver_config.kv_transfer_timeout_ms",
    ]
    assert not (tmp_path / "broken" / "deploy" / "dynamo-graph.yaml").exists()


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_every_example_config_and_its_rendered_arguments_pass(path: Path):
    config = load_config(path)  # the config rules, the lint among them, ran here
    assert check_config(config) == []
    if config.engine.backend != "tensorrt-llm":
        return
    rendered = llmapi.llm_api_options(config)
    assert nvidia_lint.lint_options(rendered) == []
    assert nvidia_lint.lint_options(llmapi.model_yaml(config, "/models/checkpoint")) == []
    # the lint reads the arguments the renderer writes
    ours = nvidia_lint.config_options(config)
    for key in nvidia_lint.CONFIG_FIELD_OF:
        assert nvidia_lint._get(ours, key) == nvidia_lint._get(rendered, key), key
