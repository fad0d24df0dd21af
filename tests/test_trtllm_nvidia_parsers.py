"""Build commands checked against NVIDIA's own parsers: one flag table per script (each naming the file and commit
it was read from), commands that parse but would do the wrong thing, and the facts not tied to 1.2.1 showing up
as warnings instead of passing silently."""

from __future__ import annotations

import pytest
from cli_inprocess import run_in_process
from trtllm_forge.builders.tensorrt_llm.plan import plan_build
from trtllm_forge.builders.tensorrt_llm.spec import TOOL_TABLES, load_spec
from trtllm_helpers import ENGINE_CONFIGS, REPO, example, unchecked_config

from trtllm_forge.errors import ConfigError

SPEC = load_spec("1.2.1")
EAGLE = {"max_num_tokens": 8192, "speculative": {"mode": "eagle", "max_draft_len": 7, "draft_model": "/m/eagle"}}
QWEN = {"source": "/models/Qwen2.5-7B-Instruct", "name": "Qwen/Qwen2.5-7B-Instruct", "family": "qwen2", "dtype": "bfloat16"}


def codes(plan) -> set[str]:
    return {w.code for w in plan.warnings}


def step(plan, name):
    return next(s for s in plan.steps if s.name == name)


def value(argv, flag):
    return argv[argv.index(flag) + 1]


# --- one flag table per script ------------------------------------------------------------------


def test_each_script_has_its_own_table_from_its_own_file():
    paths = {tool: SPEC.table_source(tool).path for tool in TOOL_TABLES}
    assert paths == {
        "trtllm-build": "tensorrt_llm/commands/build.py",
        "quantize.py": "examples/quantization/quantize.py",
        "convert_checkpoint.py": "examples/models/core/llama/convert_checkpoint.py",
        "qwen/convert_checkpoint.py": "examples/models/core/qwen/convert_checkpoint.py",
        "eagle/convert_checkpoint.py": "examples/eagle/convert_checkpoint.py",
    }
    llama, qwen, eagle = (
        set(SPEC.flags(t)) for t in ("convert_checkpoint.py", "qwen/convert_checkpoint.py", "eagle/convert_checkpoint.py")
    )
    # NVIDIA's qwen parser has none of 29 of llama's flags, the EAGLE parser none of 27 (issue 11)
    assert len(llama - qwen) == 29 and {"--fp8_kv_cache", "--use_fp8", "--calib_size"} <= llama - qwen
    assert len(llama - eagle) == 27 and {"--moe_tp_size", "--cp_size"} <= llama - eagle
    assert {"--eagle_model_dir", "--num_eagle_layers", "--max_non_leaves_per_layer"} <= eagle - llama


@pytest.mark.parametrize(
    "tool, argv, fragment",
    [
        ("qwen/convert_checkpoint.py", ["--model_dir", "m", "--fp8_kv_cache"], "unknown flag --fp8_kv_cache"),
        ("qwen/convert_checkpoint.py", ["--model_dir", "m", "--use_fp8"], "unknown flag --use_fp8"),
        (
            "qwen/convert_checkpoint.py",
            ["--weight_only_precision", "int4_awq"],
            "--weight_only_precision takes one of int8, int4, int4_gptq",
        ),
        ("eagle/convert_checkpoint.py", ["--model_dir", "m", "--moe_tp_size", "2"], "unknown flag --moe_tp_size"),
        ("eagle/convert_checkpoint.py", ["--model_dir", "m", "--cp_size", "2"], "unknown flag --cp_size"),
    ],
)
def test_nvidia_parsers_refuse_what_only_llamas_accepts(tool, argv, fragment):
    with pytest.raises(ConfigError, match=fragment.replace("-", "\\-")):
        SPEC.parser(tool).parse(argv)


VARIANTS = [
    {"model": QWEN},
    {"model": QWEN, "quantization": {"algorithm": "int8_wo"}, "parallel": {"tp": 2}},
    {"quantization": {"algorithm": "int4_wo"}, "engine": EAGLE},
    {"engine": {"max_num_tokens": 8192, "speculative": {"mode": "prompt_lookup", "max_draft_len": 4}}},
    {
        "quantization": {"algorithm": "fp8", "kv_cache": "fp8", "calibration": {"dataset": "/d/c.jsonl"}},
        "engine": {"speculative": {"mode": "draft_target", "max_draft_len": 4, "draft_model": "/m/draft"}},
    },
]


@pytest.mark.parametrize("overrides", VARIANTS)
def test_every_generated_argv_parses_with_its_own_scripts_table(overrides):
    plan = plan_build(unchecked_config(**overrides))
    checked = 0
    for s in plan.steps:
        if s.tool in TOOL_TABLES:
            SPEC.parser(s.tool).parse(s.argv[1:] if s.tool == "trtllm-build" else s.argv[2:])
            checked += 1
    assert checked >= 2


def test_example_configs_use_the_qwen_table_for_qwen():
    for path in ENGINE_CONFIGS:
        config = example(path)
        plan = plan_build(config)
        for s in plan.steps:
            if s.name.startswith("convert") and config.model.family == "qwen2":
                assert s.tool == "qwen/convert_checkpoint.py" and "/models/core/qwen/" in s.argv[1]


# --- commands NVIDIA's parsers accept that would do the wrong thing ---------------------------------


def test_prompt_lookup_engine_is_built_for_external_draft_tokens():
    plan = plan_build(unchecked_config(engine={"max_num_tokens": 8192, "speculative": {"mode": "prompt_lookup", "max_draft_len": 4}}))
    argv = step(plan, "build").argv
    assert value(argv, "--speculative_decoding_mode") == "draft_tokens_external" and value(argv, "--max_draft_len") == "4"
    assert plan.effective.max_draft_len == 4 and "prompt_lookup_not_in_engine" not in codes(plan)
    # the rest of NVIDIA's n-gram workflow (examples/ngram/README.md): paged context FMHA, KV-cache reuse, beam 1
    off = plan_build(
        unchecked_config(
            engine={
                "max_num_tokens": 8192,
                "plugins": {"paged_context_fmha": False},
                "speculative": {"mode": "prompt_lookup", "max_draft_len": 4},
            }
        )
    )
    assert value(step(off, "build").argv, "--use_paged_context_fmha") == "enable"
    assert {"prompt_lookup_forces_paged_context_fmha", "prompt_lookup_needs_kv_reuse"} <= codes(off)
    with pytest.raises(ConfigError, match=r"engine.max_beam_width: prompt lookup"):
        plan_build(
            unchecked_config(
                engine={"max_num_tokens": 8192, "max_beam_width": 2, "speculative": {"mode": "prompt_lookup", "max_draft_len": 4}}
            )
        )


@pytest.mark.parametrize("algorithm, precision, quant_algo", [("int8_wo", "int8", "W8A16"), ("int4_wo", "int4", "W4A16")])
def test_eagle_weight_only_is_passed_to_nvidias_eagle_converter(algorithm, precision, quant_algo):
    plan = plan_build(unchecked_config(quantization={"algorithm": algorithm}, engine=EAGLE))
    convert = step(plan, "convert")
    assert convert.tool == "eagle/convert_checkpoint.py"
    assert "--use_weight_only" in convert.argv and value(convert.argv, "--weight_only_precision") == precision
    assert plan.quant.quant_algo == quant_algo and "eagle_quantization_dropped" not in codes(plan)


def test_eagle_for_qwen2_and_eagle_with_pp_are_refused_in_one_line():
    with pytest.raises(ConfigError) as caught:
        plan_build(unchecked_config(model=QWEN, engine=EAGLE))
    line = caught.value.format_message()
    assert "\n" not in line and line.startswith("engine.speculative.mode: ") and "LlamaConfig" in line and "engine.target: llmapi" in line
    with pytest.raises(ConfigError, match=r"parallel.pp: NVIDIA's EAGLE converter asserts pp_size == 1"):
        plan_build(unchecked_config(parallel={"pp": 2}, engine=EAGLE))


def test_fp8_context_fmha_follows_nvidias_default_for_fp8_weights_and_fp8_kv_on_hopper():
    fp8 = {"algorithm": "fp8", "kv_cache": "fp8", "calibration": {"dataset": "/d/c.jsonl"}}
    plan = plan_build(unchecked_config(quantization=fp8))
    assert value(step(plan, "build").argv, "--use_fp8_context_fmha") == "enable"
    assert plan.effective.toggles["use_fp8_context_fmha"]
    assert SPEC.flags("trtllm-build")["--use_fp8_context_fmha"].default == "enable"
    # an explicit choice still wins
    off = plan_build(unchecked_config(quantization=fp8, engine={"plugins": {"fp8_context_fmha": False}, "max_num_tokens": 4096}))
    assert value(step(off, "build").argv, "--use_fp8_context_fmha") == "disable"


def test_bf16_draft_engine_does_not_inherit_the_fp8_targets_plugins():
    plan = plan_build(
        unchecked_config(
            quantization={"algorithm": "fp8", "kv_cache": "fp8", "calibration": {"dataset": "/d/c.jsonl"}},
            engine={
                "plugins": {"low_latency_gemm": True},
                "speculative": {"mode": "draft_target", "max_draft_len": 4, "draft_model": "/m/draft"},
            },
        )
    )
    target, draft = step(plan, "build").argv, step(plan, "build-draft").argv
    assert value(target, "--gemm_plugin") == "disable" and value(target, "--low_latency_gemm_plugin") == "fp8"
    assert value(draft, "--gemm_plugin") == "auto"
    assert "--low_latency_gemm_plugin" not in draft and value(draft, "--use_fp8_context_fmha") == "disable"
    assert "--use_weight_only" not in step(plan, "convert-draft").argv


# --- provenance -------------------------------------------------------------------------------------


def test_every_row_of_every_table_names_its_source():
    sources = SPEC.data["sources"]
    for key, source in sources.items():
        assert source["repo"] and source["path"], key
        assert "commit" in source and (source["commit"] or source["uncertain"]), key
    for tool in TOOL_TABLES:
        for flag in SPEC.flags(tool).values():
            assert flag.source in sources, (tool, flag.flag)
    meta = {"schema", "tensorrt_llm_version", "compatible_versions", "note", "sources", "checked"}
    for section, body in SPEC.data.items():
        if section == "container":  # the image facts live in their own table, sourced row by row
            assert body["table"] == "serving-images.json"
        elif section not in meta:
            assert isinstance(body, dict) and body.get("source") in sources, section


def test_facts_not_tied_to_1_2_1_are_warnings_in_build_engine_and_plan(tmp_path):
    config = str(REPO / "configs" / "qwen2.5-7b-fp16-l40s-tp2.yaml")
    build = run_in_process("build-engine", config, "--workdir", str(tmp_path / "wd"), "--dry-run")
    assert build.returncode == 0, build.stderr
    assert (
        "[uncertain_source] convert, convert-draft: checked against NVIDIA/TensorRT-LLM@65b31db1b401:examples/models/core/qwen/convert_checkpoint.py"
        in build.stderr
    )
    assert "[uncertain_flag] build: --kv_cache_type" in build.stderr
    # NGC images ship 1.2.1 (26.04-26.07, spec/serving-images.json): the image is no route of ours, nothing uncertain
    assert "serving image: no NGC Triton image ships" not in build.stderr
    plan = run_in_process("plan", config, "--workdir", str(tmp_path / "wd"), "--dry-run", "--no-plot")
    assert plan.returncode == 0, plan.stderr
    assert "tensorrt_llm/commands/build.py, not tied to TensorRT-LLM 1.2.1" in plan.stderr and "[uncertain_source]" in plan.stderr
