"""ModelOpt's quantization on the LLM-API path, checked against NVIDIA's own files: every hf_ptq.py command we render
parses with the parser rebuilt (ast, never imported) from the pinned script (tests/fixtures/nvidia_modelopt/, SOURCE
there), the step runs in the release image images.py names, its export is an absolute path the build manifest
records and model.yaml loads, and a checkpoint ModelOpt already quantized is read (hf_quant_config.json, config.json)
instead of quantized again."""

from __future__ import annotations

import argparse
import ast
import json
import shutil
from pathlib import Path

import pytest
import yaml
from cli_inprocess import run_in_process
from trtllm_forge.builders.tensorrt_llm import images, modelopt
from trtllm_forge.builders.tensorrt_llm.plan import plan_build
from trtllm_helpers import BASE, REPO, merge

from trtllm_forge.config.schema import ForgeConfig
from trtllm_forge.errors import ConfigError
from trtllm_forge.importer.prequantized import check_declared, read_prequantized
from trtllm_forge.llmapi_args import LLMAPI_VERSIONS
from trtllm_forge.stage_results import BuildResult

FIXTURES = REPO / "tests" / "fixtures" / "nvidia_modelopt"
HF_PTQ = FIXTURES / "hf_ptq.0.37.0.py.txt"
LLMAPI = {"engine": {"target": "llmapi"}}


# --- hf_ptq.py's parser, rebuilt from the pinned file -----------------------------------------------


def _dict_keys(tree: ast.Module) -> dict[str, list[str]]:
    """Module-level NAME = {"key": ...} assignments (the format tables) → their keys."""
    out: dict[str, list[str]] = {}
    for node in tree.body:
        target = node.target if isinstance(node, ast.AnnAssign) else node.targets[0] if isinstance(node, ast.Assign) else None
        if isinstance(target, ast.Name) and isinstance(node.value, ast.Dict):  # type: ignore[union-attr]
            out[target.id] = [k.value for k in node.value.keys if isinstance(k, ast.Constant)]  # type: ignore[union-attr]
    return out


def _literal(node: ast.expr, tables: dict[str, list[str]]) -> object:
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "keys":
        assert isinstance(node.func.value, ast.Name)
        return tables[node.func.value.id]
    if isinstance(node, ast.Name) and node.id in ("int", "float", "str"):
        return {"int": int, "float": float, "str": str}[node.id]
    if isinstance(node, ast.Attribute) and node.attr == "BooleanOptionalAction":
        return argparse.BooleanOptionalAction
    if isinstance(node, ast.JoinedStr):
        return "(f-string)"
    return ast.literal_eval(node)


def hf_ptq_parser() -> tuple[argparse.ArgumentParser, dict[str, list[str]]]:
    """NVIDIA's parser: every parser.add_argument call of the pinned file, with its flags, type, action, choices,
    default and required, replayed onto an argparse parser that exits with an error instead of the process."""
    tree = ast.parse(HF_PTQ.read_text())
    tables = _dict_keys(tree)

    class Refusing(argparse.ArgumentParser):
        def error(self, message: str) -> None:  # type: ignore[override]
            raise ValueError(message)

    parser = Refusing(prog="hf_ptq.py", add_help=False)
    calls = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument"
    ]
    for call in calls:
        flags = [arg.value for arg in call.args if isinstance(arg, ast.Constant)]
        kwargs = {kw.arg: _literal(kw.value, tables) for kw in call.keywords if kw.arg and kw.arg != "help"}
        parser.add_argument(*flags, **kwargs)  # type: ignore[arg-type]
    return parser, tables


def test_the_fixture_names_its_source_and_holds_the_whole_parser():
    header = HF_PTQ.read_text().splitlines()[:6]
    assert any("NVIDIA/Model-Optimizer@df0882a63c39a001a1be384b680166a41259045c:examples/llm_ptq/hf_ptq.py" in line for line in header)
    parser, tables = hf_ptq_parser()
    flags = {a.option_strings[0] for a in parser._actions}
    assert {"--pyt_ckpt_path", "--qformat", "--kv_cache_qformat", "--export_path", "--calib_size", "--trust_remote_code"} <= flags
    assert set(tables["KV_QUANT_CFG_CHOICES"]) == {"none", "fp8", "nvfp4", "nvfp4_affine"}
    # the trap the step avoids: leaving --kv_cache_qformat out quantizes the KV cache to FP8
    assert parser.parse_args(["--pyt_ckpt_path", "/m"]).kv_cache_qformat == "fp8"


def _config(**overrides: object) -> ForgeConfig:
    return ForgeConfig.model_validate(merge(merge(BASE, LLMAPI), overrides))


@pytest.mark.parametrize("kv", ["none", "fp8"])
@pytest.mark.parametrize("algorithm", sorted(modelopt.QFORMAT))
def test_every_rendered_command_parses_with_nvidias_parser(tmp_path, algorithm, kv):
    config = _config(quantization={"algorithm": algorithm, "kv_cache": kv, "calibration": {"size": 64}}, model={"trust_remote_code": True})
    plan = plan_build(config, workdir=tmp_path)
    step = next(s for s in plan.steps if s.name == "modelopt-quantize")
    parser, tables = hf_ptq_parser()
    args = parser.parse_args(step.argv[2:])
    assert step.argv[1].endswith(modelopt.HF_PTQ)
    assert args.qformat in tables["QUANT_CFG_CHOICES"] and args.qformat == modelopt.QFORMAT[algorithm]
    assert args.kv_cache_qformat == kv and args.calib_size == "64" and args.trust_remote_code is True
    assert Path(args.export_path).is_absolute() and Path(args.export_path).parent.parent == tmp_path.resolve()


def test_a_format_modelopt_cannot_export_is_refused_naming_the_field(tmp_path):
    with pytest.raises(ConfigError, match=r"^quantization.kv_cache: int8 is not a KV-cache format of ModelOpt"):
        plan_build(_config(quantization={"algorithm": "fp8", "kv_cache": "int8"}), workdir=tmp_path)
    with pytest.raises(ConfigError, match=r"^quantization.algorithm: int8_wo has no ModelOpt Hugging Face export"):
        plan_build(_config(quantization={"algorithm": "int8_wo"}), workdir=tmp_path)


# --- the image: the release image of the config's LLM-API version, named in one place ---------------


@pytest.mark.parametrize("version", LLMAPI_VERSIONS)
def test_the_step_runs_in_the_release_image_of_the_llmapi_version(tmp_path, version):
    config = _config(engine={"llmapi_version": version}, quantization={"algorithm": "fp8"})
    plan = plan_build(config, workdir=tmp_path)
    release = images.release_image(version)
    assert release.image.endswith(f"/tensorrt-llm/release:{version}") and release.modelopt.startswith("~=0.37")
    docker = plan.llmapi["quantize"]["docker_run"]
    assert plan.container_image == release.image and docker[docker.index(release.image) + 1 :] == next(
        s.argv for s in plan.steps if s.name == "modelopt-quantize"
    )
    sources = images.matrix()["sources"]
    assert all(key in sources for key in release.sources)
    for module in ("modelopt.py", "plan.py", "execute.py", "llmapi.py"):
        assert "tensorrt-llm/release" not in (REPO / "builders" / "tensorrt_llm" / module).read_text(), module


# --- a checkpoint ModelOpt already quantized ----------------------------------------------------------


@pytest.mark.parametrize(
    "fixture, name, field, algo, algorithm",
    [
        ("hf_quant_config.nvfp4.json", "hf_quant_config.json", "quantization.quant_algo", "NVFP4", "nvfp4"),
        ("hf_quant_config.fp8.json", "hf_quant_config.json", "quantization.quant_algo", "FP8", "fp8"),
        ("config.quantization_config.fp8.json", "config.json", "quantization_config.quant_algo", "FP8", "fp8"),
    ],
)
def test_modelopts_own_files_are_read(tmp_path, fixture, name, field, algo, algorithm):
    shutil.copyfile(FIXTURES / fixture, tmp_path / name)
    found = read_prequantized(tmp_path)
    assert found is not None and (found.file, found.field, found.quant_algo, found.algorithm) == (tmp_path / name, field, algo, algorithm)
    assert found.describe() == f"pre-quantized ({algo}) — from {name}"
    check_declared(found, algorithm)
    check_declared(found, "none")
    with pytest.raises(ConfigError) as caught:
        check_declared(found, "int4_awq")
    line = caught.value.format_message()
    assert "\n" not in line and line.startswith("quantization.algorithm: int4_awq") and f"{tmp_path / name} {field} is {algo}" in line


def _checkpoint(tmp_path: Path, quant_fixture: str | None) -> Path:
    """A local checkpoint folder: the public Llama-3.1-8B config.json shape (plus ModelOpt's file when given)."""
    from trtllm_forge.model_shape import model_catalog

    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(model_catalog()["meta-llama/Llama-3.1-8B-Instruct"]))
    (folder / "model.safetensors").write_bytes(b"")
    if quant_fixture:
        shutil.copyfile(FIXTURES / quant_fixture, folder / "hf_quant_config.json")
    return folder


def _config_file(tmp_path: Path, source: Path, algorithm: str) -> Path:
    data = merge(merge(BASE, LLMAPI), {"model": {"source": str(source)}, "quantization": {"algorithm": algorithm}})
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_a_prequantized_source_skips_the_step_and_a_mismatch_exits_2(tmp_path):
    source = _checkpoint(tmp_path, "hf_quant_config.fp8.json")
    ok = run_in_process(
        "build-engine", str(_config_file(tmp_path, source, "fp8")), "--workdir", str(tmp_path / "wd"), "--dry-run", "--json"
    )
    assert ok.returncode == 0, ok.stderr
    plan = json.loads(ok.stdout)["plan"]
    assert [s["name"] for s in plan["steps"]] == ["write-model-yaml", "write-llm-api-options"]
    assert plan["llmapi"]["model_yaml"]["model"] == str(source) and plan["llmapi"]["quantize"] is None
    assert "pre-quantized (FP8) — from hf_quant_config.json" in ok.stderr
    bad = run_in_process("build-engine", str(_config_file(tmp_path, source, "int4_awq")), "--workdir", str(tmp_path / "wd"), "--dry-run")
    errors = [line for line in bad.stderr.splitlines() if line.startswith("error:")]
    assert bad.returncode == 2 and len(errors) == 1 and "Traceback" not in bad.stderr
    assert (
        f"quantization.algorithm: int4_awq, but the checkpoint is already quantized: {source}/hf_quant_config.json quantization.quant_algo is FP8"
        in (errors[0])
    )


def test_the_export_is_absolute_recorded_and_loaded(tmp_path):
    source = _checkpoint(tmp_path, None)
    config = _config_file(tmp_path, source, "fp8")
    workdir = tmp_path / "wd"
    refused = run_in_process("build-engine", str(config), "--workdir", str(workdir))
    if refused.returncode == 0:
        pytest.skip("ModelOpt and a GPU are here: the step ran instead of being refused")
    errors = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
    assert refused.returncode == 2 and len(errors) == 1, refused.stderr
    export = modelopt.quantized_dir(workdir, "fp8", "none", 512)
    assert f"run it in {images.release_image('1.2.1').image}: git clone" in errors[0] and f"--export_path {export}" in errors[0]
    assert not (workdir / "build").exists()
    # What the docker command leaves behind (ModelOpt writes hf_quant_config.json first, config.json's
    # quantization_config last): half an export is not picked up, a finished one is.
    export.mkdir(parents=True)
    shutil.copyfile(FIXTURES / "hf_quant_config.fp8.json", export / "hf_quant_config.json")
    half = run_in_process("build-engine", str(config), "--workdir", str(workdir))
    assert half.returncode == 2 and "cannot run here" in half.stderr
    shutil.copyfile(FIXTURES / "config.quantization_config.fp8.json", export / "config.json")
    built = run_in_process("build-engine", str(config), "--workdir", str(workdir), "--json")
    assert built.returncode == 0, built.stderr
    outputs = json.loads(built.stdout)["outputs"]
    assert outputs["quantized_checkpoint"] == str(export) and Path(outputs["quantized_checkpoint"]).is_absolute()
    assert BuildResult.in_workdir(workdir).quantized_checkpoint == export
    assert yaml.safe_load((workdir / "build/llmapi/model.yaml").read_text())["model"] == str(export)
    assert json.loads((workdir / "build/llmapi/serve.json").read_text())["argv"][1] == str(export)
    rendered = run_in_process("render", str(config), "--workdir", str(workdir))
    assert rendered.returncode == 0, rendered.stderr
    [triton_yaml] = (workdir / "render").rglob("model.yaml")  # NVIDIA's llmapi model loads the export too
    assert yaml.safe_load(triton_yaml.read_text())["model"] == str(export)
    # an export of another format is refused, naming ModelOpt's file
    shutil.copyfile(FIXTURES / "hf_quant_config.nvfp4.json", export / "hf_quant_config.json")
    again = run_in_process("build-engine", str(config), "--workdir", str(workdir))
    assert again.returncode == 2 and f"{export}/hf_quant_config.json quantization.quant_algo is NVFP4" in again.stderr


def test_plan_names_a_prequantized_source_and_refuses_a_mismatch(tmp_path):
    source = _checkpoint(tmp_path, "hf_quant_config.nvfp4.json")
    config = _config_file(tmp_path, source, "none")
    shown = run_in_process("plan", str(config), "--workdir", str(tmp_path / "wd"), "--json")
    assert shown.returncode == 0, shown.stderr
    [warning] = [w for w in json.loads(shown.stdout)["fact_warnings"] if w["code"] == "prequantized_checkpoint"]
    assert warning["field"] == "model.source" and warning["message"].startswith("pre-quantized (NVFP4) — from hf_quant_config.json")
    refused = run_in_process("plan", str(_config_file(tmp_path, source, "fp8")), "--workdir", str(tmp_path / "wd"))
    assert refused.returncode == 2 and "quantization.quant_algo is NVFP4; quantization.algorithm: nvfp4" in refused.stderr


def test_plan_sizes_a_prequantized_checkpoint_as_stored(tmp_path):
    """`quantization.algorithm: none` loads the checkpoint as it is: an FP8 checkpoint's weights are FP8 in plan."""
    for sub in ("a", "b"):
        (tmp_path / sub).mkdir()
    plain = run_in_process("plan", str(_config_file(tmp_path / "a", _checkpoint(tmp_path / "a", None), "none")), "--json")
    fp8 = run_in_process(
        "plan", str(_config_file(tmp_path / "b", _checkpoint(tmp_path / "b", "hf_quant_config.fp8.json"), "none")), "--json"
    )
    assert plain.returncode == 0 and fp8.returncode == 0, plain.stderr + fp8.stderr
    weights = [json.loads(shown.stdout)["memory"]["weights_bytes_per_gpu"] for shown in (plain, fp8)]
    assert weights[1] < 0.6 * weights[0]  # 8-bit weights against 16-bit: about half
