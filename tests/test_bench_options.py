"""Each bench option is defined once (trtllm_forge/bench/options.py): a workload key and its flag reach the same
BenchOptions field with the same value, and the defaults of the flags, the config schema and BenchOptions agree."""

from __future__ import annotations

import dataclasses

import pytest
import yaml
from conftest import CONFIGS

from trtllm_forge.bench.config_runs import options_from_config
from trtllm_forge.bench.options import OPTIONS, BenchOptions, from_command_line
from trtllm_forge.cli import main
from trtllm_forge.commands.bench_cmd import bench_run
from trtllm_forge.config import load_config
from trtllm_forge.config.schema import BenchWorkload

WORKLOAD = """
bench:
  workloads:
    - name: w
      target: triton-http
      concurrency: [2, 6]
      arrival: gamma
      num_requests: 5
      duration_s: 2.5
      warmup_requests: 0
      input_len: "10..20"
      output_len: "12:3"
      seed: 7
      slo_ms: {ttft: 250, e2e: 900}
"""
FLAGS = [
    "--target", "triton-http", "--concurrency", "2,6", "--arrival", "gamma", "--num-requests", "5", "--duration", "2.5",
    "--warmup", "0", "--input-len", "10..20", "--output-len", "12:3", "--seed", "7", "--slo", "ttft:250", "--slo", "e2e:900",
]  # fmt: skip


def _config_with_workload(tmp_path):
    document = yaml.safe_load((CONFIGS / "smollm2-cpu.yaml").read_text())
    document["bench"] = yaml.safe_load(WORKLOAD)["bench"]
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(document))
    return load_config(path)


def _comparable(options: BenchOptions) -> dict:
    data = options.describe()
    return {name: data[name] for name, spec in OPTIONS.items() if spec.key is not None}


def test_every_workload_key_and_its_flag_give_the_same_options(tmp_path):
    config = _config_with_workload(tmp_path)
    (from_config,) = options_from_config(config, tmp_path, {}, None, tmp_path / "out", emit=True)
    context = bench_run.make_context("run", [*FLAGS, "--url", "x:1", "--model", "m"])
    given = from_command_line(context.params)
    from_flags = BenchOptions(**given, output_len_given=True)
    assert _comparable(from_config) == _comparable(from_flags)
    assert _comparable(from_config)["input_len"] == "10..20" and from_config.slo == {"ttft": 250.0, "e2e": 900.0}
    # every key of the config schema's workload is an option's key, and the reverse
    assert set(BenchWorkload.model_fields) - {"name"} == {spec.key for spec in OPTIONS.values() if spec.key}


def test_defaults_agree_between_flags_schema_and_options(tmp_path):
    config = _config_with_workload(tmp_path)
    (from_config,) = options_from_config(config.model_copy(update={"bench": type(config.bench)()}), tmp_path, {}, emit=True)
    defaults = BenchOptions(url="u", model="m")
    for name, spec in OPTIONS.items():
        if spec.key is None or name == "concurrency":  # the config sweeps [1]; BenchOptions' empty sweep runs c1 too
            continue
        schema_default = BenchWorkload.model_fields[spec.key].get_default(call_default_factory=True)
        value = getattr(defaults, name)
        assert str(schema_default) == (value.describe() if hasattr(value, "describe") else str(value)), name
        assert getattr(from_config, name) == value, name
    assert BenchWorkload.model_fields["concurrency"].get_default(call_default_factory=True) == [1]
    assert [load.label for load in defaults.loads()] == ["c1"]


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--concurrency", "1,x"], "--concurrency: '1,x' is not a comma-separated list of numbers"),
        (["--slo", "foo:1"], "--slo: 'foo:1' is not an SLO"),
        (["--input-len", "0"], "--input-len: '0' is not a length"),
        (["--burstiness", "0"], "Invalid value for '--burstiness'"),
    ],
)
def test_bad_flags_exit_2_with_one_line(args, needle, capsys):
    with pytest.raises(SystemExit) as exited:
        main(["bench", "--url", "x:1", "--model", "m", *args, "--dry-run"])
    err = capsys.readouterr().err
    assert exited.value.code == 2, err
    assert needle in err and len(err.strip().splitlines()) == 1, err


def test_every_option_field_is_a_dataclass_field():
    fields = {f.name for f in dataclasses.fields(BenchOptions)}
    assert set(OPTIONS) <= fields and {"output_len_given", "http_url", "server_stubs"} == fields - set(OPTIONS)


def test_automatic_grpc_lanes_are_one_per_request_in_flight_up_to_16():
    """bench/run.py auto_streams: a lane (stream, connection and reader thread) per request in flight, at most 16."""
    from trtllm_forge.bench.run import auto_streams

    assert [auto_streams(BenchOptions(url="u", model="m", concurrency=[c])) for c in (1, 4, 16, 64)] == [1, 4, 16, 16]
    assert auto_streams(BenchOptions(url="u", model="m", concurrency=[1, 64], workers=2)) == 16
    assert auto_streams(BenchOptions(url="u", model="m", concurrency=[16], workers=2)) == 8
    assert auto_streams(BenchOptions(url="u", model="m", request_rate=[50.0])) == 16
