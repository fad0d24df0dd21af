"""Our five rendered inflight_batcher_llm models against NVIDIA's TensorRT-LLM 1.2-line config.pbtxt files.

The facts live in tests/fixtures/triton_contract_1.2.json: for each model the repository, commit and path
of NVIDIA's file (NVIDIA/TensorRT-LLM, triton_backend/all_models/inflight_batcher_llm/*/config.pbtxt),
every input and output, and every `parameters` key. test_render_contract.py compares inputs and outputs
(name, data_type, dims, optional, reshape, ragged); this file compares the rest: provenance present,
parameters keys, fixed parameter values, and the scheduling / transaction-policy shape of each model.
Every key we render that NVIDIA's file does not have is a deliberate difference listed in OUR_ADDITIONS
and in the README ("Differences from NVIDIA's 1.2 model files"); a new one fails here until it is listed.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import CONFIGS, REPO
from trtllm_helpers import draft_engine_fixture

from trtllm_forge.config import load_config
from trtllm_forge.engine_config import read_engine_config
from trtllm_forge.render.repository import write_repository

FIXTURES = REPO / "tests" / "fixtures"
ENGINES = FIXTURES / "engines"
DRAFT_ENGINES = (FIXTURES / "draft_engines").resolve()
FACTS = json.loads((FIXTURES / "triton_contract_1.2.json").read_text())["models"]
MODELS = ("ensemble", "preprocessing", "tensorrt_llm", "postprocessing", "tensorrt_llm_bls")
EXAMPLES = sorted(p.name for p in ENGINES.iterdir() if p.is_dir())
# Examples whose engine model is NVIDIA's C++ backend (the cpu kind's is our python model).
GPU_EXAMPLES = [e for e in EXAMPLES if not load_config(CONFIGS / f"{e}.yaml").engine.on_cpu]

# Parameters we add to NVIDIA's set, and why (the README lists the same).
OUR_ADDITIONS = {
    "preprocessing": {"trust_remote_code", "EXECUTION_ENV_PATH"},
    "postprocessing": {"trust_remote_code", "EXECUTION_ENV_PATH"},
    "tensorrt_llm": {"EXECUTION_ENV_PATH"},  # only the cpu kind, whose engine model is a python model
    "tensorrt_llm_bls": {
        "trust_remote_code",
        "EXECUTION_ENV_PATH",
        "tokenizer_dir",
        "skip_special_tokens",
        "preprocessing_model_name",
        "tensorrt_llm_decoupled",
        # Draft-target repositories only: what a request that does not send num_draft_tokens / use_draft_logits gets.
        "default_num_draft_tokens",
        "default_use_draft_logits",
    },
    "ensemble": set(),
}
# NVIDIA keys a rendered repository must always carry (the rest are written only when the config sets them;
# unset, NVIDIA's model uses the same default as for an unfilled ${placeholder}).
ALWAYS = {
    "preprocessing": {"tokenizer_dir", "add_special_tokens"},
    "postprocessing": {"tokenizer_dir", "skip_special_tokens"},
    "tensorrt_llm_bls": {"accumulate_tokens", "tensorrt_llm_model_name", "tensorrt_llm_draft_model_name", "multimodal_encoders_name"},
    "tensorrt_llm": {
        "gpt_model_path",
        "max_beam_width",
        "batch_scheduler_policy",
        "kv_cache_free_gpu_mem_fraction",
        "exclude_input_in_output",
        "enable_kv_cache_reuse",
        "enable_chunked_context",
    },
    "ensemble": set(),
}


def parse(path: Path):
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    return text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    out = {}
    for example in EXAMPLES:
        config = load_config(CONFIGS / f"{example}.yaml")
        kind = "cpu" if config.engine.on_cpu else "inflight_batcher_llm"
        workdir = tmp_path_factory.mktemp(f"parity-{example}")
        engine = read_engine_config(ENGINES / example)
        repo = write_repository(config, workdir, engine, kind, workdir / "repo", draft_engine_fixture(example)).repository
        out[example] = (kind, {m.parent.name: parse(m) for m in repo.glob("*/config.pbtxt")})
    return out


@pytest.mark.parametrize("model", [*MODELS, "llmapi"])
def test_every_fact_names_the_nvidia_file_it_comes_from(model):
    source = FACTS[model]["source"]
    assert source["repo"] == "NVIDIA/TensorRT-LLM"
    assert re.fullmatch(r"[0-9a-f]{40}", source["commit"])
    assert source["path"].startswith("triton_backend/all_models/") and source["path"].endswith("config.pbtxt")
    assert FACTS[model]["inputs"] and FACTS[model]["outputs"]


@pytest.mark.parametrize("example", EXAMPLES)
@pytest.mark.parametrize("model", MODELS)
def test_parameter_keys_are_nvidias_or_a_listed_difference(rendered, example, model):
    kind, configs = rendered[example]
    keys = set(configs[model].parameters)
    unknown = keys - set(FACTS[model]["parameters"]) - OUR_ADDITIONS[model]
    assert not unknown, f"{model}: parameters NVIDIA's file does not have and the README does not list: {sorted(unknown)}"
    always = ALWAYS[model] | (
        {"gpt_model_type", "FORCE_CPU_ONLY_INPUT_TENSORS", "executor_worker_path"} if model == "tensorrt_llm" and kind != "cpu" else set()
    )
    assert always <= keys, f"{model}: missing {sorted(always - keys)}"


@pytest.mark.parametrize("example", GPU_EXAMPLES)
def test_fixed_values_of_the_engine_model_are_nvidias(rendered, example):
    _, configs = rendered[example]
    params = {k: v.string_value for k, v in configs["tensorrt_llm"].parameters.items()}
    for key, value in FACTS["tensorrt_llm"]["fixed_parameter_values"].items():
        assert params[key] == value


def test_bls_names_the_draft_model_only_when_drafting_and_no_multimodal_encoder(rendered):
    """NVIDIA's BLS reads an empty name as 'none'; a draft-target repository names its draft engine model, which is
    in the repository; none renders an encoder model."""
    for example, (_kind, configs) in rendered.items():
        params = {k: v.string_value for k, v in configs["tensorrt_llm_bls"].parameters.items()}
        assert params["multimodal_encoders_name"] == "" and params["tensorrt_llm_model_name"] == "tensorrt_llm"
        if example in DRAFT_EXAMPLES:
            assert params["tensorrt_llm_draft_model_name"] == "tensorrt_llm_draft" in configs
        else:
            assert params["tensorrt_llm_draft_model_name"] == "" and "tensorrt_llm_draft" not in configs
            assert "default_num_draft_tokens" not in params


DRAFT_EXAMPLES = [e for e in GPU_EXAMPLES if load_config(CONFIGS / f"{e}.yaml").engine.speculative.mode == "draft_target"]


@pytest.mark.parametrize("example", DRAFT_EXAMPLES)
def test_draft_model_is_nvidias_copy_of_the_engine_model_with_the_draft_engine(rendered, example):
    """examples/draft_target_model/README.md (NVIDIA/TensorRT-LLM 567239fc): `cp -r tensorrt_llm tensorrt_llm_draft`,
    rename, and fill both with the same values except engine_dir, decoupled_mode:False for the draft."""
    from trtllm_forge.plan.draft import engine_draft_kv_settings

    _, configs = rendered[example]
    target, draft = configs["tensorrt_llm"], configs["tensorrt_llm_draft"]
    assert draft.name == "tensorrt_llm_draft" and draft.backend == "tensorrtllm"
    assert not draft.model_transaction_policy.decoupled and target.model_transaction_policy.decoupled
    assert draft.max_batch_size == target.max_batch_size and draft.HasField("dynamic_batching")
    params = {k: v.string_value for k, v in draft.parameters.items()}
    target_params = {k: v.string_value for k, v in target.parameters.items()}
    assert set(params) <= set(FACTS["tensorrt_llm"]["parameters"]) and ALWAYS["tensorrt_llm"] <= set(params)
    for key, value in FACTS["tensorrt_llm"]["fixed_parameter_values"].items():
        assert params[key] == value
    assert params["gpt_model_path"] == str(DRAFT_ENGINES / example) != target_params["gpt_model_path"]
    assert {k: v for k, v in params.items() if k != "gpt_model_path"} == {k: v for k, v in target_params.items() if k != "gpt_model_path"}
    # The KV settings plan sizes the draft's pool with (plan/draft.py), NVIDIA's README needs reuse on both.
    fraction, cap = engine_draft_kv_settings(load_config(CONFIGS / f"{example}.yaml"))
    assert params["kv_cache_free_gpu_mem_fraction"] == str(fraction) and params.get("max_tokens_in_paged_kv_cache") == (
        None if cap is None else str(cap)
    )
    assert params["enable_kv_cache_reuse"] == "true" and params["gpt_model_type"] == "inflight_fused_batching"
    bls = {k: v.string_value for k, v in configs["tensorrt_llm_bls"].parameters.items()}
    assert bls["default_num_draft_tokens"] == str(load_config(CONFIGS / f"{example}.yaml").engine.speculative.max_draft_len)
    # Qwen2.5-7B pads its vocabulary to 152064, the 0.5B draft to 151936: the target cannot take the draft's logits.
    assert bls["default_use_draft_logits"] == "false"


@pytest.mark.parametrize("example", EXAMPLES)
def test_scheduling_and_transaction_policy_as_nvidia_declares_them(rendered, example):
    """NVIDIA: dynamic batching on preprocessing, tensorrt_llm and postprocessing, none on the BLS and the
    ensemble (which schedules by its steps); a transaction policy on tensorrt_llm and the BLS only."""
    _, configs = rendered[example]
    for model in MODELS:
        config = configs[model]
        assert config.max_batch_size > 0, model
        assert config.HasField("dynamic_batching") == (model in ("preprocessing", "tensorrt_llm", "postprocessing")), model
        assert config.HasField("model_transaction_policy") == (model in ("tensorrt_llm", "tensorrt_llm_bls")), model
    assert configs["ensemble"].platform == "ensemble"


def test_preprocessing_image_inputs_follow_the_shipped_pixtral_design():
    """The preprocessing facts are the design NVIDIA merged (IMAGE_SIZES input, IMAGE_URL [-1]); the other
    stored version (IMAGES, IMAGE_URL [1]) is recorded with the reason it was not used."""
    inputs = {t["name"]: t for t in FACTS["preprocessing"]["inputs"]}
    assert inputs["IMAGE_URL"]["dims"] == [-1] and inputs["IMAGE_SIZES"]["dims"] == [-1, 2] and "IMAGES" not in inputs
    other = FACTS["preprocessing"]["source"]["other_stored_version"]
    assert re.fullmatch(r"[0-9a-f]{40}", other["commit"]) and "IMAGES" in other["differs"] and other["why_not_used"]
    assert "image_sizes_input" in {t["name"] for t in FACTS["tensorrt_llm_bls"]["inputs"]}
