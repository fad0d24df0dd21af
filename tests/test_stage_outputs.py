"""Later stages find the imported checkpoint through the import manifest, never by guessing its path:
a Hugging Face directory is recorded in place (not copied under <workdir>/import/checkpoint)."""

from __future__ import annotations

from trtllm_forge.config.load import parse_config
from trtllm_forge.importer.stage import imported_checkpoint
from trtllm_forge.render.values import tokenizer_dir_for
from trtllm_forge.stage_results import ImportResult
from trtllm_forge.stages import run_stage


def test_recorded_hf_directory_is_what_render_and_build_see(tmp_path):
    workdir = tmp_path / "wd"
    source = tmp_path / "my-hf-model"
    source.mkdir()
    assert imported_checkpoint(workdir) is None and ImportResult.in_workdir(workdir) is None
    run_stage(workdir, "import", {"source": str(source)}, {}, lambda tmp, rec: {"checkpoint_dir": str(source)})
    assert imported_checkpoint(workdir) == source
    config = parse_config(
        {"model": {"source": str(source), "family": "llama"}, "engine": {"backend": "tensorrt-llm"}, "hardware": {"gpu": "H100-SXM"}},
        name="t",
    )
    assert tokenizer_dir_for(config, workdir, "inflight_batcher_llm", None) == source.resolve()
    assert not (workdir / "import" / "checkpoint").exists()
