"""render on a draft-target config (engine path): where the draft engine is found, what is refused, how the MPI
leader-mode command loads it, and that `plan` and the rendered draft model read one KV setting."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from conftest import CONFIGS, REPO
from trtllm_helpers import DRAFT_ENGINES, draft_engine_fixture

from trtllm_forge.config.schema import ForgeConfig
from trtllm_forge.engine_config import read_engine_config
from trtllm_forge.errors import ConfigError, ConfigErrors
from trtllm_forge.render.draft import locate_draft_engine
from trtllm_forge.render.launch import plan_launch
from trtllm_forge.render.repository import write_repository

EXAMPLE = "qwen2.5-7b-fp16-l40s-tp2"
ENGINE = REPO / "tests" / "fixtures" / "engines" / EXAMPLE


def config(**sections) -> ForgeConfig:
    data = yaml.safe_load((CONFIGS / f"{EXAMPLE}.yaml").read_text())
    for section, values in sections.items():
        data.setdefault(section, {}).update(values)
    return ForgeConfig.model_validate(data)  # field checks only: render's own refusals are what is tested


def build_layout(tmp_path: Path) -> Path:
    """<build>/engine and <build>/draft/engine as the build stage lays them out; returns the target engine dir."""
    engine = tmp_path / "build" / "engine"
    engine.mkdir(parents=True)
    shutil.copy(ENGINE / "config.json", engine / "config.json")
    draft = tmp_path / "build" / "draft" / "engine"
    draft.mkdir(parents=True)
    shutil.copy(DRAFT_ENGINES / EXAMPLE / "config.json", draft / "config.json")
    return engine


def render(tmp_path: Path, cfg: ForgeConfig, engine_dir: Path):
    return write_repository(cfg, tmp_path, read_engine_config(engine_dir), "inflight_batcher_llm", tmp_path / "repo")


def parameters(path: Path) -> dict[str, str]:
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    parsed = text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())
    return {k: v.string_value for k, v in parsed.parameters.items()}


def test_the_draft_engine_beside_the_built_engine_is_found_and_served(tmp_path):
    engine = build_layout(tmp_path)
    rendered = render(tmp_path, config(), engine)
    assert "tensorrt_llm_draft" in rendered.models
    assert parameters(rendered.repository / "tensorrt_llm_draft" / "config.pbtxt")["gpt_model_path"] == str(
        (tmp_path / "build" / "draft" / "engine").resolve()
    )
    assert not any("no config.json" in w for w in rendered.warnings)
    assert not any("does not add it yet" in w for w in rendered.warnings)


def test_the_build_stage_manifest_names_the_draft_engine(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(DRAFT_ENGINES / EXAMPLE, elsewhere)
    (tmp_path / "build").mkdir()
    (tmp_path / "build" / "manifest.json").write_text(
        json.dumps({"stage": "build", "outputs": {"target": "engine", "engine_dir": str(ENGINE), "draft_engine_dir": str(elsewhere)}})
    )
    found = locate_draft_engine(tmp_path, ENGINE)
    assert found.directory == elsewhere.resolve() and found.info is not None and found.info.vocab_size == 151936


def test_a_draft_engine_not_on_this_machine_is_rendered_where_the_build_puts_it_with_a_warning(tmp_path):
    engine = tmp_path / "build" / "engine"
    engine.mkdir(parents=True)
    shutil.copy(ENGINE / "config.json", engine / "config.json")
    rendered = render(tmp_path, config(), engine)
    expected = (tmp_path / "build" / "draft" / "engine").resolve()
    assert parameters(rendered.repository / "tensorrt_llm_draft" / "config.pbtxt")["gpt_model_path"] == str(expected)
    assert any(f"draft engine {expected} has no config.json" in w for w in rendered.warnings)


def test_the_ensemble_entrypoint_is_warned_that_only_the_bls_drafts(tmp_path):
    engine = build_layout(tmp_path)
    ensemble = render(tmp_path / "a", config(), engine)
    bls = render(tmp_path / "b", config(triton={"entrypoint": "bls"}), engine)
    assert any("drafting runs in the BLS" in w for w in ensemble.warnings)
    assert not any("drafting runs in the BLS" in w for w in bls.warnings)


REFUSED = [
    ({"runtime": {"enable_kv_cache_reuse": False}}, None, "runtime.enable_kv_cache_reuse"),
    (
        {"engine": {"speculative": {"mode": "draft_target", "max_draft_len": 8, "draft_model": "/models/d"}}},
        None,
        "engine.speculative.max_draft_len",
    ),
    ({}, {"max_batch_size": 8}, "draft engine"),
    ({}, {"use_paged_context_fmha": False}, "draft engine"),
]


@pytest.mark.parametrize("sections,draft_change,field", REFUSED, ids=["no-reuse", "draft-len", "draft-batch", "draft-fmha"])
def test_refuses_what_the_draft_target_loop_cannot_serve(tmp_path, sections, draft_change, field):
    engine = build_layout(tmp_path)
    if draft_change:
        path = tmp_path / "build" / "draft" / "engine" / "config.json"
        data = json.loads(path.read_text())
        for key, value in draft_change.items():
            (data["build_config"]["plugin_config"] if key == "use_paged_context_fmha" else data["build_config"])[key] = value
        path.write_text(json.dumps(data))
    with pytest.raises((ConfigError, ConfigErrors)) as info:
        render(tmp_path, config(**sections), engine)
    assert field in str(info.value)


def test_every_leader_mode_rank_loads_the_target_and_the_draft(tmp_path):
    engine = build_layout(tmp_path)
    rendered = render(tmp_path, config(), engine)
    assert rendered.engine_models == ("tensorrt_llm", "tensorrt_llm_draft")
    plan = plan_launch(config(), rendered.repository, world_size=rendered.world_size, engine_models=rendered.engine_models)
    ranks = " ".join(plan.argv).split(" : ")
    assert len(ranks) == 2 and "--model-control-mode=none" in ranks[0]
    assert "--load-model=tensorrt_llm --load-model=tensorrt_llm_draft" in ranks[1]


def test_plan_sizes_the_draft_pool_with_the_values_render_writes(tmp_path):
    """plan's draft pool (plan/draft.py) and tensorrt_llm_draft/config.pbtxt read one KV setting."""
    from trtllm_forge.plan.draft import engine_draft_kv_settings

    cfg = config(runtime={"enable_kv_cache_reuse": True, "kv_cache_free_gpu_mem_fraction": 0.45, "max_tokens_in_paged_kv_cache": 16384})
    rendered = write_repository(
        cfg, tmp_path, read_engine_config(ENGINE), "inflight_batcher_llm", tmp_path / "repo", draft_engine_fixture(EXAMPLE)
    )
    params = parameters(rendered.repository / "tensorrt_llm_draft" / "config.pbtxt")
    assert (float(params["kv_cache_free_gpu_mem_fraction"]), int(params["max_tokens_in_paged_kv_cache"])) == engine_draft_kv_settings(cfg)
    assert engine_draft_kv_settings(cfg) == (0.45, 16384)


@pytest.mark.parametrize("target", ["docker", "kubernetes"])
def test_docker_and_kubernetes_renderings_serve_the_draft_model(tmp_path, target):
    """`render` then `deploy --target ... --dry-run` through the CLI: the repository they serve holds the draft model,
    its engine is inside the mounted workdir, and the rendered MPI command loads it on every rank."""
    from cli_inprocess import run_in_process

    workdir = tmp_path / "wd"
    engine = build_layout(workdir)
    cfg = tmp_path / "draft.yaml"
    data = yaml.safe_load((CONFIGS / f"{EXAMPLE}.yaml").read_text())
    data.setdefault("deploy", {})["target"] = target  # rendered for a container: its python models use the image's Python
    cfg.write_text(yaml.safe_dump(data))
    rendered = run_in_process("render", str(cfg), "--engine-dir", str(engine), "--workdir", str(workdir))
    assert rendered.returncode == 0, rendered.stderr
    repo = workdir / "render" / "model_repository"
    assert parameters(repo / "tensorrt_llm_draft" / "config.pbtxt")["gpt_model_path"] == str(
        (workdir / "build" / "draft" / "engine").resolve()
    )
    result = run_in_process("deploy", str(cfg), "--workdir", str(workdir), "--target", target, "--dry-run")
    assert result.returncode == 0, result.stderr
    if target == "docker":
        command = result.stdout
        assert f"-v {workdir}:{workdir}:ro" in command
    else:
        [pod] = [d["spec"]["template"]["spec"] for d in yaml.safe_load_all(result.stdout) if d["kind"] == "Deployment"]
        command = " ".join(pod["containers"][0]["command"])
        mount = next(m for m in pod["containers"][0]["volumeMounts"] if m["mountPath"] == str(workdir))
        assert mount["readOnly"] and mount["subPath"] == str(workdir).lstrip("/")
        assert next(v for v in pod["volumes"] if v["name"] == mount["name"])["persistentVolumeClaim"]
    # rank 0 loads every model of the repository, rank 1 the two engine models
    assert command.count("--model-control-mode=none") == 1
    assert "--model-control-mode=explicit --load-model=tensorrt_llm --load-model=tensorrt_llm_draft " in command
