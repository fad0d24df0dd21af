"""The typed stage results are the one reader of manifest.json: what a stage records through run_stage comes back
as typed fields (also when a later run skips the stage or another command finds it on disk), and a manifest that
lacks what the next stage needs is one clear error, not a KeyError."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import CONFIGS, REPO

from trtllm_forge.config import load_config
from trtllm_forge.deploy.launch import default_repository, rendered_leader_command
from trtllm_forge.errors import ConfigError
from trtllm_forge.render.repository import render_repository
from trtllm_forge.stage_results import BuildResult, ImportResult, RenderResult
from trtllm_forge.stages import run_stage

ENGINES = REPO / "tests" / "fixtures" / "engines"


def test_import_outputs_round_trip_through_the_manifest(tmp_path):
    workdir = tmp_path / "wd"
    outputs = {"checkpoint_dir": str(tmp_path / "ckpt"), "dtype": "bfloat16", "num_parameters": 134515008, "tokenizer": {"eos_token_id": 2}}
    done = ImportResult.from_stage(run_stage(workdir, "import", {"v": 1}, {}, lambda tmp, rec: outputs))
    skipped = ImportResult.from_stage(run_stage(workdir, "import", {"v": 1}, {}, lambda tmp, rec: pytest.fail("must be skipped")))
    found = ImportResult.in_workdir(workdir)
    assert not done.skipped and skipped.skipped and found is not None
    for result in (done, skipped, found):
        assert result.checkpoint_dir == tmp_path / "ckpt" and result.dtype == "bfloat16"
        assert result.num_parameters == 134515008 and result.tokenizer == {"eos_token_id": 2}
        assert result.tokenizer_dir is None and result.directory == workdir / "import"


def test_an_import_manifest_without_checkpoint_is_a_config_error(tmp_path):
    run_stage(tmp_path, "import", {}, {}, lambda tmp, rec: {"dtype": "float32"})
    with pytest.raises(ConfigError, match="no checkpoint_dir"):
        ImportResult.in_workdir(tmp_path)


@pytest.mark.parametrize("content", [None, "{not json", "{}"])
def test_no_or_broken_manifest_reads_as_no_result(tmp_path, content):
    if content is not None:
        (tmp_path / "build").mkdir()
        (tmp_path / "build" / "manifest.json").write_text(content)
    found = BuildResult.in_workdir(tmp_path)
    if content == "{}":  # a manifest without outputs: a build that produced nothing usable
        assert found is not None and found.engine_dir is None and found.llmapi_dir is None
    else:
        assert found is None


def test_build_target_follows_what_the_builder_recorded(tmp_path):
    llmapi = BuildResult.from_stage(run_stage(tmp_path / "a", "build", {}, {}, lambda tmp, rec: {"llmapi_dir": str(tmp_path / "l")}))
    engine = BuildResult.from_stage(run_stage(tmp_path / "b", "build", {}, {}, lambda tmp, rec: {"engine_dir": str(tmp_path / "e")}))
    assert (llmapi.target, llmapi.model_yaml, llmapi.engine_dir) == ("llmapi", tmp_path / "l" / "model.yaml", None)
    assert (engine.target, engine.engine_dir, engine.model_yaml) == ("engine", tmp_path / "e", None)


def test_render_result_is_what_deploy_reads(tmp_path):
    repository = tmp_path / "elsewhere" / "model_repository"
    argv = ["mpirun", "-n", "1", "tritonserver", f"--model-repository={repository}"]
    outputs = {"kind": "inflight_batcher_llm", "repository": str(repository), "launch_command": argv, "world_size": 2}
    rendered = RenderResult.from_stage(run_stage(tmp_path, "render", {}, {}, lambda tmp, rec: outputs))
    assert rendered.repository == repository and rendered.kind == "inflight_batcher_llm" and rendered.world_size == 2
    assert default_repository(tmp_path) == repository
    assert rendered_leader_command(tmp_path, 2) == argv


def test_a_hand_written_render_manifest_with_a_command_string(tmp_path):
    (tmp_path / "render").mkdir()
    (tmp_path / "render" / "manifest.json").write_text(json.dumps({"outputs": {"launch_command": "mpirun -n 3 'triton server'"}}))
    found = RenderResult.in_workdir(tmp_path)
    assert found is not None and found.launch_command == ["mpirun", "-n", "3", "triton server"]
    assert found.repository == tmp_path / "render" / "model_repository" == default_repository(tmp_path)
    assert Path(found.directory) == tmp_path / "render"


def test_a_copied_workdir_reads_its_own_paths(tmp_path):
    """A workdir copied (or moved) after its stages ran: what the stages recorded under the old workdir is read
    as under the new one; paths outside it, and a sibling whose name starts the same, stay as they were."""
    original, sibling, outside = tmp_path / "wd", tmp_path / "wd2", tmp_path / "ckpt"
    built = {"engine_dir": f"{original}/build/engine", "draft_engine_dir": f"{sibling}/build/engine"}
    run_stage(original, "build", {}, {}, lambda tmp, rec: built)
    argv = ["tritonserver", f"--model-repository={original}/render/model_repository", f"--log-file={outside}/x"]
    run_stage(original, "render", {}, {}, lambda tmp, rec: {"repository": f"{original}/render/model_repository", "launch_command": argv})
    copy = tmp_path / "copy"
    shutil.copytree(original, copy)

    for workdir in (original, copy):
        build, render = BuildResult.in_workdir(workdir), RenderResult.in_workdir(workdir)
        assert build is not None and render is not None
        assert build.engine_dir == workdir / "build" / "engine" and build.draft_engine_dir == sibling / "build" / "engine"
        assert render.repository == workdir / "render" / "model_repository"
        assert render.launch_command == ["tritonserver", f"--model-repository={workdir}/render/model_repository", f"--log-file={outside}/x"]
        assert build.moved_here(f"{original}/build/engine") == str(workdir / "build" / "engine")
    assert json.loads((copy / "build" / "manifest.json").read_text())["outputs"] == built  # the records are not rewritten


def test_a_copied_workdir_renders_its_own_engine(tmp_path):
    """Copy a built and rendered workdir, change a render setting: the copy's repository serves the copy's engine
    (it served the original's, recorded in the copied build manifest, when the build was skipped)."""
    config = load_config(CONFIGS / "smollm2-cpu.yaml")
    original = tmp_path / "wd"

    def build(tmp, rec):
        shutil.copytree(ENGINES / "smollm2-cpu", tmp / "engine")
        return {"engine_dir": str(original / "build" / "engine")}

    run_stage(original, "build", {}, {}, build)
    first = render_repository(config, original, None)
    copy = tmp_path / "copy"
    shutil.copytree(original, copy)
    changed = config.model_copy(update={"triton": config.triton.model_copy(update={"entrypoint": "bls"})})
    rendered = render_repository(changed, copy, None)
    assert first.engine_dir == original / "build" / "engine" and rendered.engine_dir == copy / "build" / "engine"
    text = "\n".join(p.read_text() for p in rendered.repository.rglob("config.pbtxt"))
    assert str(copy / "build" / "engine") in text and str(original) not in text
