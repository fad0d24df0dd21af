"""render: every example config renders a repository that parses, and the rendered tensor contract of each
model equals the TensorRT-LLM 1.2 tables (tests/fixtures/triton_contract_1.2.json), so a drift fails here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_inprocess import run_in_process
from conftest import CONFIGS, REPO
from trtllm_helpers import draft_engine_fixture, eagle_engine_example

from trtllm_forge.config import load_config
from trtllm_forge.engine_config import read_engine_config
from trtllm_forge.errors import ConfigError
from trtllm_forge.render.repository import write_repository

FIXTURES = REPO / "tests" / "fixtures"
ENGINES = FIXTURES / "engines"
CONTRACT = json.loads((FIXTURES / "triton_contract_1.2.json").read_text())["models"]
EXAMPLES = sorted(p.name for p in ENGINES.iterdir() if p.is_dir())
ROLE_OF = {
    "ensemble": "ensemble",
    "preprocessing": "preprocessing",
    "tensorrt_llm": "tensorrt_llm",
    "postprocessing": "postprocessing",
    "tensorrt_llm_bls": "tensorrt_llm_bls",
}
DTYPE_VALUES = {
    "${logits_datatype}": "TYPE_FP32",
    "${encoder_input_features_data_type}": None,
    "${prompt_embedding_table_data_type}": "TYPE_FP16",
}


def parse(path: Path):
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    return text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())


def tensor_rows(tensors, with_optional: bool) -> list[tuple]:
    from tritonclient.grpc import model_config_pb2

    rows = []
    for t in tensors:
        reshape = list(t.reshape.shape) if t.HasField("reshape") else None
        row = (t.name, model_config_pb2.DataType.Name(t.data_type), list(t.dims), reshape)
        if with_optional:
            row += (t.optional, t.allow_ragged_batch)
        rows.append(row)
    return rows


def expected_rows(tensors, with_optional: bool, engine_dtype: str) -> list[tuple]:
    rows, seen = [], set()
    for t in tensors:
        if t["name"] in seen:  # NVIDIA's ensemble declares kv_cache_alloc_total_blocks twice; we declare it once
            continue
        seen.add(t["name"])
        dtype = t["data_type"]
        if dtype.startswith("${"):
            dtype = DTYPE_VALUES[dtype] or engine_dtype
        row = (t["name"], dtype, t["dims"], t["reshape"])
        if with_optional:
            row += (t["optional"], t["allow_ragged_batch"])
        rows.append(row)
    return rows


def config_for(example: str):
    return load_config(CONFIGS / f"{example}.yaml")


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    """example -> repository rendered from configs/<example>.yaml and its engine fixture."""
    out = {}
    for example in EXAMPLES:
        config = config_for(example)
        workdir = tmp_path_factory.mktemp(f"wd-{example}")
        kind = "cpu" if config.engine.on_cpu else "inflight_batcher_llm"
        engine = read_engine_config(ENGINES / example)
        out[example] = write_repository(config, workdir, engine, kind, workdir / "repo", draft_engine_fixture(example))
    return out


def test_every_example_config_has_an_engine_fixture():
    examples = {p.stem for p in CONFIGS.glob("*.yaml")}
    assert examples <= set(EXAMPLES), f"engine fixtures missing for {sorted(examples - set(EXAMPLES))}"


@pytest.mark.parametrize("example", EXAMPLES)
def test_every_config_pbtxt_parses_and_has_no_placeholder(rendered, example):
    repo = rendered[example].repository
    configs = sorted(repo.glob("*/config.pbtxt"))
    drafting = ["tensorrt_llm_draft"] if config_for(example).engine.speculative.mode == "draft_target" else []
    assert [p.parent.name for p in configs] == [
        "ensemble",
        "postprocessing",
        "preprocessing",
        "tensorrt_llm",
        "tensorrt_llm_bls",
        *drafting,
    ]
    for path in configs:
        assert "${" not in path.read_text()
        assert parse(path).name == path.parent.name
        assert (path.parent / "1").is_dir()


DRAFT_EXAMPLES = [e for e in EXAMPLES if config_for(e).engine.speculative.mode == "draft_target"]


@pytest.mark.parametrize(
    "example,model", [(e, m) for e in EXAMPLES for m in sorted(ROLE_OF)] + [(e, "tensorrt_llm_draft") for e in DRAFT_EXAMPLES]
)
def test_tensor_contract_matches_trtllm_1_2(rendered, example, model):
    """The draft engine model is NVIDIA's tensorrt_llm config copied (examples/draft_target_model/README.md): its contract."""
    engine = read_engine_config(ENGINES / example)
    engine_dtype = {"float16": "TYPE_FP16", "bfloat16": "TYPE_BF16", "float32": "TYPE_FP32"}[engine.dtype]
    config = parse(rendered[example].repository / model / "config.pbtxt")
    table = CONTRACT[ROLE_OF.get(model, "tensorrt_llm")]
    # Ensemble outputs carry no optional flag; compare optional/ragged on inputs only.
    assert tensor_rows(config.input, True) == expected_rows(table["inputs"], True, engine_dtype)
    assert tensor_rows(config.output, False) == expected_rows(table["outputs"], False, engine_dtype)


def test_ensemble_name_translations(rendered):
    config = parse(rendered["llama3.1-8b-fp8-h100"].repository / "ensemble" / "config.pbtxt")
    steps = {s.model_name: s for s in config.ensemble_scheduling.step}
    assert [s.model_name for s in config.ensemble_scheduling.step] == ["preprocessing", "tensorrt_llm", "postprocessing"]
    engine_inputs = dict(steps["tensorrt_llm"].input_map)
    for engine_name, client_name in (
        ("runtime_top_k", "top_k"),
        ("runtime_top_p", "top_p"),
        ("len_penalty", "length_penalty"),
        ("streaming", "stream"),
        ("request_output_len", "_REQUEST_OUTPUT_LEN"),
        ("input_ids", "_INPUT_ID"),
        ("stop_words_list", "_STOP_WORDS_IDS"),
    ):
        assert engine_inputs[engine_name] == client_name
    assert dict(steps["preprocessing"].input_map)["REQUEST_OUTPUT_LEN"] == "max_tokens"
    assert dict(steps["preprocessing"].input_map)["QUERY"] == "text_input"
    assert dict(steps["postprocessing"].output_map) == {"OUTPUT": "text_output"}
    assert dict(steps["tensorrt_llm"].output_map)["output_ids"] == "_TOKENS_BATCH"


def parameters(repo: Path, model: str) -> dict[str, str]:
    return {k: v.string_value for k, v in parse(repo / model / "config.pbtxt").parameters.items()}


def test_engine_bound_values_come_from_the_engine(rendered, tmp_path):
    repo = rendered["llama3.1-70b-fp8-h200-tp4"].repository
    engine = parse(repo / "tensorrt_llm" / "config.pbtxt")
    assert engine.backend == "tensorrtllm"
    assert engine.max_batch_size == 128 and engine.model_transaction_policy.decoupled
    params = parameters(repo, "tensorrt_llm")
    assert params["gpt_model_path"] == str((ENGINES / "llama3.1-70b-fp8-h200-tp4").resolve())
    assert params["gpt_model_type"] == "inflight_fused_batching"
    assert params["batch_scheduler_policy"] == "max_utilization"
    assert params["enable_chunked_context"] == "true" and params["exclude_input_in_output"] == "true"
    assert "max_tokens_in_paged_kv_cache" not in params  # unset in the config: omitted, never rendered empty
    assert all(value for value in params.values())
    # Containers: no EXECUTION_ENV_PATH (the image's Python serves the python models).
    assert "EXECUTION_ENV_PATH" not in parameters(repo, "preprocessing")
    # EAGLE on the engine path (the shipped 8B example is on the LLM API path, where choice trees are refused).
    engine = read_engine_config(ENGINES / "llama3.1-8b-fp8-h100")
    eagle_repo = write_repository(eagle_engine_example(), tmp_path, engine, "inflight_batcher_llm", tmp_path / "repo", None)
    eagle = parameters(eagle_repo.repository, "tensorrt_llm")
    assert eagle["decoding_mode"] == "eagle" and eagle["eagle_choices"].startswith("{0}, {0, 0}, {1}")


def test_cpu_kind_uses_python_backend_with_the_same_contract(rendered):
    repo = rendered["smollm2-cpu"].repository
    engine = parse(repo / "tensorrt_llm" / "config.pbtxt")
    assert engine.backend == "python" and engine.model_transaction_policy.decoupled
    params = parameters(repo, "tensorrt_llm")
    assert params["gpt_model_path"] == str((ENGINES / "smollm2-cpu").resolve())
    assert params["max_tokens_in_paged_kv_cache"] == "32768"
    assert {
        "enable_kv_cache_reuse",
        "enable_chunked_context",
        "batch_scheduler_policy",
        "max_beam_width",
        "exclude_input_in_output",
        "kv_cache_free_gpu_mem_fraction",
    } <= set(params)
    assert "max_queue_size" not in params  # 0 in the config: omitted
    assert "arrival_window_ms" not in params  # unset: the model's own ARRIVAL_WINDOW_MS
    assert (repo / "tensorrt_llm" / "1" / "model.py").read_text() == (REPO / "model_repo_templates/cpu/tensorrt_llm/model.py").read_text()
    for model in ("preprocessing", "postprocessing", "tensorrt_llm_bls", "tensorrt_llm"):
        env = parameters(repo, model)["EXECUTION_ENV_PATH"]
        assert Path(env).is_absolute()
    assert parameters(repo, "preprocessing")["tokenizer_dir"] == str((ENGINES / "smollm2-cpu").resolve())


@pytest.mark.parametrize("window", [0, 35])
def test_the_arrival_window_reaches_the_cpu_engine_model(tmp_path, window):
    config = config_for("smollm2-cpu")
    config = config.model_copy(update={"runtime": config.runtime.model_copy(update={"arrival_window_ms": window})})
    repo = write_repository(config, tmp_path, read_engine_config(ENGINES / "smollm2-cpu"), "cpu", tmp_path / "repo").repository
    assert parameters(repo, "tensorrt_llm")["arrival_window_ms"] == str(window)


# --- refusals: combinations the backend rejects at load, each naming the config field ---------------

REFUSALS = [
    ("runtime:\n  streaming: true\ntriton:\n  decoupled: false\n", "triton.decoupled"),
    ("engine:\n  max_beam_width: 4\n", "engine.max_beam_width"),
    ("runtime:\n  enable_kv_cache_reuse: true\n", "runtime.enable_kv_cache_reuse"),
    ("runtime:\n  enable_chunked_context: true\n", "runtime.enable_chunked_context"),
    ("engine:\n  gather_logits:\n    context: true\n", "engine.gather_logits.context"),
    ("parallel:\n  tp: 2\n", "parallel.tp"),
    ("runtime:\n  max_tokens_in_paged_kv_cache: 2000\n", "runtime.max_tokens_in_paged_kv_cache"),
    ("engine:\n  max_batch_size: 64\n", "engine.max_batch_size"),
]


@pytest.mark.parametrize("extra,field", REFUSALS, ids=[f for _, f in REFUSALS])
def test_refuses_combinations_the_backend_rejects(tmp_path, extra, field):
    # The mistral fixture: 32 sequences, beam 1, max_seq_len 4096, blocks of 32, no paged context FMHA, tp 1.
    # Built without the config loader's own cross-field checks, so that render's refusal is what is tested.
    config = unchecked_config(merge_yaml((CONFIGS / "mistral-7b-int4awq-a10g.yaml").read_text(), extra))
    with pytest.raises(ConfigError) as err:
        write_repository(config, tmp_path, read_engine_config(ENGINES / "mistral-7b-int4awq-a10g"), "inflight_batcher_llm", tmp_path / "r")
    fields = [e.where for e in getattr(err.value, "errors", [err.value])]
    assert field in fields
    assert not (tmp_path / "r" / "ensemble").exists()


def unchecked_config(text: str):
    import yaml

    from trtllm_forge.config import ForgeConfig

    return ForgeConfig.model_validate({**yaml.safe_load(text), "config_dir": str(CONFIGS)})


def merge_yaml(base: str, extra: str) -> str:
    import yaml

    data = yaml.safe_load(base)
    for section, values in yaml.safe_load(extra).items():
        data.setdefault(section, {})
        for key, value in values.items():
            if isinstance(value, dict):
                data[section].setdefault(key, {}).update(value)
            else:
                data[section][key] = value
    return yaml.safe_dump(data)


def test_kv_budget_of_exactly_one_sequence_is_accepted(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(merge_yaml((CONFIGS / "mistral-7b-int4awq-a10g.yaml").read_text(), "runtime:\n  max_tokens_in_paged_kv_cache: 4096\n"))
    rendered = write_repository(
        load_config(path), tmp_path, read_engine_config(ENGINES / "mistral-7b-int4awq-a10g"), "inflight_batcher_llm", tmp_path / "r"
    )
    assert parameters(rendered.repository, "tensorrt_llm")["max_tokens_in_paged_kv_cache"] == "4096"


def test_kind_must_match_the_engine(tmp_path):
    with pytest.raises(ConfigError, match="OpenVINO engine"):
        write_repository(
            config_for("mistral-7b-int4awq-a10g"), tmp_path, read_engine_config(ENGINES / "mistral-7b-int4awq-a10g"), "cpu", tmp_path / "r"
        )


# --- the CLI ----------------------------------------------------------------------------------------


def test_cli_render_stage_json_launch_and_cache(tmp_path):
    args = [
        "render",
        str(CONFIGS / "llama3.1-70b-fp8-h200-tp4.yaml"),
        "--engine-dir",
        str(ENGINES / "llama3.1-70b-fp8-h200-tp4"),
        "--workdir",
        str(tmp_path),
        "--json",
    ]
    first = run_in_process(*args)
    assert first.returncode == 0, first.stderr
    out = json.loads(first.stdout)
    assert out["kind"] == "inflight_batcher_llm" and not out["skipped"]
    assert out["repository"] == str(tmp_path / "render" / "model_repository")
    argv = out["launch_command"]
    assert argv[:2] == ["mpirun", "--allow-run-as-root"] and argv.count(":") == 3
    assert [a for a in argv if a.startswith("--backend-config")] == [
        f"--backend-config=python,shm-region-prefix-name=prefix{rank}_" for rank in range(4)
    ]
    assert argv.count("--load-model=tensorrt_llm") == 3  # every rank but the leader loads only the engine model
    assert "--disable-auto-complete-config" in argv
    script = (tmp_path / "render" / "launch.sh").read_text()
    assert script.startswith("#!/usr/bin/env bash") and "mpirun --allow-run-as-root" in script
    manifest = json.loads((tmp_path / "render" / "manifest.json").read_text())
    assert manifest["outputs"]["launch_command"] == argv
    second = run_in_process(*args)
    assert second.returncode == 0 and json.loads(second.stdout)["skipped"]


def test_cli_dry_run_changes_nothing(tmp_path):
    result = run_in_process(
        "render",
        str(CONFIGS / "mistral-7b-int4awq-a10g.yaml"),
        "--engine-dir",
        str(ENGINES / "mistral-7b-int4awq-a10g"),
        "--workdir",
        str(tmp_path / "wd"),
        "--dry-run",
        "--json",
    )
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert plan["dry_run"] and any(f.endswith("tensorrt_llm/config.pbtxt") for f in plan["files"])
    assert plan["launch_command"][0] == "/opt/tritonserver/bin/tritonserver"
    assert not (tmp_path / "wd").exists()


def test_cli_refusal_is_one_line_exit_2(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(merge_yaml((CONFIGS / "mistral-7b-int4awq-a10g.yaml").read_text(), "parallel:\n  tp: 2\n"))
    result = run_in_process(
        "render", str(path), "--engine-dir", str(ENGINES / "mistral-7b-int4awq-a10g"), "--workdir", str(tmp_path / "wd")
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith("error: parallel.tp: ")
    assert "Traceback" not in result.stderr


def test_cli_missing_engine_dir_is_a_config_error(tmp_path):
    result = run_in_process("render", str(CONFIGS / "mistral-7b-int4awq-a10g.yaml"), "--workdir", str(tmp_path))
    assert result.returncode == 2 and "error: --engine-dir:" in result.stderr


def test_llmapi_and_vllm_kinds(tmp_path):
    config = config_for("qwen2.5-7b-fp16-l40s-tp2")
    llmapi = write_repository(config, tmp_path, None, "llmapi", tmp_path / "llmapi")
    model = parse(llmapi.repository / "tensorrt_llm" / "config.pbtxt")
    assert model.max_batch_size == 0 and model.model_transaction_policy.decoupled  # stated explicitly
    assert tensor_rows(model.input, True) == expected_rows(CONTRACT["llmapi"]["inputs"], True, "")
    import yaml

    args = yaml.safe_load((llmapi.repository / "tensorrt_llm" / "1" / "model.yaml").read_text())
    assert args["backend"] == "pytorch" and args["tensor_parallel_size"] == 2
    assert args["kv_cache_config"]["enable_block_reuse"] is True and args["max_batch_size"] == 16
    vllm = write_repository(config, tmp_path, None, "vllm", tmp_path / "vllm")
    engine_args = json.loads((vllm.repository / "vllm_model" / "1" / "model.json").read_text())
    assert engine_args["tensor_parallel_size"] == 2 and engine_args["max_model_len"] == 8192
    assert parse(vllm.repository / "vllm_model" / "config.pbtxt").backend == "vllm"


def test_cli_render_cpu_default_for_the_wheel_server(tmp_path):
    result = run_in_process(
        "render", str(CONFIGS / "smollm2-cpu.yaml"), "--engine-dir", str(ENGINES / "smollm2-cpu"), "--workdir", str(tmp_path), "--json"
    )
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["kind"] == "cpu" and out["world_size"] == 1
    argv = out["launch_command"]
    assert argv[0].endswith("pytriton/tritonserver/bin/tritonserver")
    backend_dir = Path(next(a for a in argv if a.startswith("--backend-directory=")).split("=", 1)[1])
    assert {p.name for p in (backend_dir / "python").iterdir()} == {
        "libtriton_python.so",
        "triton_python_backend_utils.py",
        "triton_python_backend_stub",
    }
    assert "nvidia_pytriton.libs" in out["launch_env"]["LD_LIBRARY_PATH"]
    assert "--http-address=127.0.0.1" in argv
    # The python stub gets an environment whose first numpy is 1.x (the wheel's stub breaks on numpy 2).
    env = Path(parameters(Path(out["repository"]), "preprocessing")["EXECUTION_ENV_PATH"])
    probe = __import__("subprocess").run(
        [str(env / "bin" / "python"), "-c", "import numpy, tokenizers; print(numpy.__version__)"], capture_output=True, text=True
    )
    assert probe.returncode == 0 and probe.stdout.startswith("1."), probe.stderr


def test_string_parameters_are_escaped(tmp_path):
    from trtllm_forge.render.templates import pb_string

    tricky = 'dir with "quotes" \\ back\\slash and ünïcode'
    config = parse_text(f'name: "m"\nparameters {{ key: "k" value: {{ string_value: {pb_string(tricky)} }} }}\n')
    assert config.parameters["k"].string_value == tricky


def parse_text(text: str):
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    return text_format.Parse(text, model_config_pb2.ModelConfig())


def test_non_streaming_deployment_renders_without_decoupled(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(
        merge_yaml((CONFIGS / "mistral-7b-int4awq-a10g.yaml").read_text(), "runtime:\n  streaming: false\ntriton:\n  decoupled: false\n")
    )
    rendered = write_repository(
        load_config(path), tmp_path, read_engine_config(ENGINES / "mistral-7b-int4awq-a10g"), "inflight_batcher_llm", tmp_path / "r"
    )
    for model in ("tensorrt_llm", "tensorrt_llm_bls"):
        assert not parse(rendered.repository / model / "config.pbtxt").model_transaction_policy.decoupled
    assert parameters(rendered.repository, "tensorrt_llm_bls")["tensorrt_llm_decoupled"] == "false"


@pytest.mark.parametrize(
    ("triton", "count", "warned"),
    [
        ({}, 1, False),  # clients call the ensemble: the BLS is there but idle
        ({"entrypoint": "bls"}, 16, False),  # one instance per request the engine batches (max_batch_size 16)
        ({"entrypoint": "bls", "instances": {"bls": 2}}, 2, True),  # set by the user: kept, with a warning
    ],
)
def test_bls_instances_follow_the_entry_point(tmp_path, triton, count, warned):
    """NVIDIA's model_config.md (tensorrt_llm_bls, bls_instance_count): each BLS instance serves one request at a
    time, so a BLS entry point gets as many instances as the engine's max batch size."""
    config = load_config(CONFIGS / "smollm2-cpu.yaml")
    data = config.model_dump()
    data["triton"] = {**data["triton"], **triton, "instances": {**data["triton"]["instances"], "bls": None, **triton.get("instances", {})}}
    config = type(config).model_validate(data)
    engine = read_engine_config(ENGINES / "smollm2-cpu")
    assert engine.max_batch_size == 16
    rendered = write_repository(config, tmp_path, engine, "cpu", tmp_path / "model_repository")
    bls = parse(tmp_path / "model_repository" / "tensorrt_llm_bls" / "config.pbtxt")
    assert [group.count for group in bls.instance_group] == [count]
    assert any("triton.instances.bls" in warning for warning in rendered.warnings) == warned
