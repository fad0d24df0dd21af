"""`trtllm-forge plan`: will it fit, how many sequences at once, and how fast it can possibly go."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from trtllm_forge.atomic_files import write_json_atomic
from trtllm_forge.commands.options import dry_run_option, json_option, load, optional_config_argument, workdir_option
from trtllm_forge.errors import ConfigError
from trtllm_forge.ui import emit_json, info, warn

if TYPE_CHECKING:
    from trtllm_forge.config.schema import ForgeConfig
    from trtllm_forge.plan.planner import Plan, Workload


@click.command("plan")
@optional_config_argument
@click.option(
    "--measure-host",
    is_flag=True,
    help="Measure this machine's memory bandwidth and matrix throughput (a few seconds) and store them "
    "as the 'cpu' hardware entry used by every later plan and report.",
)
@click.option(
    "--input-len",
    type=click.IntRange(min=1),
    default=None,
    help="Prompt tokens of the workload. Default: the first bench workload, else engine.max_input_len.",
)
@click.option(
    "--output-len",
    type=click.IntRange(min=1),
    default=None,
    help="Output tokens of the workload. Default: the first bench workload, else max_seq_len - max_input_len.",
)
@click.option("--plot/--no-plot", default=True, show_default=True, help="Write the roofline PNG.")
@click.option(
    "--predict",
    is_flag=True,
    help="Also ask NVIDIA AIConfigurator (installed by `make setup`, offline) for its simulated TTFT, TPOT, tokens/s "
    "per GPU and per user and memory at this GPU, model, parallelism, batch size and input/output lengths.",
)
@workdir_option
@json_option
@dry_run_option
def plan(
    config_file: Path | None,
    measure_host: bool,
    input_len: int | None,
    output_len: int | None,
    plot: bool,
    predict: bool,
    workdir: Path | None,
    as_json: bool,
    dry_run: bool,
) -> None:
    """Memory per GPU, KV-cache capacity, build limits and the roofline of CONFIG on its target hardware.

    \b
    Writes <workdir>/plan/plan.json and <workdir>/plan/roofline.png.
    Exits 2 with the smallest change that would fit when one full sequence does not fit.
    """
    if config_file is None and not measure_host:
        raise ConfigError("CONFIG", "missing", "pass a config file, or --measure-host to calibrate this machine")
    result: dict = {}
    if measure_host:
        result["host"] = _measure_host(dry_run)
    if config_file is None:
        if as_json:
            emit_json(result)
        return

    from trtllm_forge.plan.advise import refusal
    from trtllm_forge.plan.planner import default_workload, make_plan
    from trtllm_forge.plan.report import plan_to_dict, show_report

    config, wd = load(config_file, workdir)
    workload = _workload(config, default_workload(config), input_len, output_len)
    the_plan = make_plan(config, workload)
    data = {**result, **plan_to_dict(the_plan)}
    if not the_plan.fits:
        where, problem, valid = refusal(the_plan)
        data["refusal"] = {"field": where, "problem": problem, "fix": valid}
        if as_json:
            emit_json(data)
        raise ConfigError(where, problem, valid)
    # Facts the build plan relies on that are not tied to the pinned TensorRT-LLM release (after a refusal, the
    # one error line is all that is printed).
    from rich.markup import escape

    from trtllm_forge.builders.tensorrt_llm.plan import fact_warnings

    data["fact_warnings"] = [w.to_dict() for w in fact_warnings(config)]
    for item in data["fact_warnings"]:
        warn(escape(f"{item['field']}: {item['message']} [{item['code']}]"))

    if predict:
        data["prediction"] = _predict(the_plan)

    out_dir = wd / "plan"
    files = [out_dir / "plan.json"] + ([out_dir / "roofline.png"] if plot and the_plan.machine else [])
    if dry_run:
        for path in files:
            info(f"would write {path}")
    else:
        _write_json(files[0], data)
        if len(files) > 1:
            from trtllm_forge.plan.plot import plot_roofline

            plot_roofline(the_plan, files[1])
        data["files"] = [str(p) for p in files]
    if plot and the_plan.machine is None:
        warn("no roofline plot: the target's bandwidth and throughput are unknown")
    show_report(the_plan, data)
    if not dry_run:
        info("wrote " + ", ".join(str(p) for p in files))
    if as_json:
        emit_json(data)


def _predict(the_plan: Plan) -> dict[str, Any]:
    """AIConfigurator's prediction as plan.json's `prediction`; a refusal is one warning line, and the plan goes on."""
    from rich.markup import escape

    from trtllm_forge.plan.aiconfigurator import predict

    prediction = predict(the_plan)
    if prediction.status != "simulated":
        warn(escape(f"prediction {'refused' if prediction.status == 'unsupported' else 'unavailable'}: {prediction.reason}"))
    return prediction.to_dict()


def _workload(config: ForgeConfig, default: Workload, input_len: int | None, output_len: int | None) -> Workload:
    from trtllm_forge.plan.planner import Workload

    workload = Workload(input_len or default.input_len, output_len or default.output_len)
    limit = config.engine.max_seq_len
    if workload.seq_len > limit:
        flag = "--output-len" if output_len else "--input-len"
        raise ConfigError(
            flag, f"input + output = {workload.seq_len} tokens exceeds engine.max_seq_len ({limit})", f"keep input + output <= {limit}"
        )
    return workload


def _measure_host(dry_run: bool) -> dict:
    from trtllm_forge.hardware import host_profile_path
    from trtllm_forge.plan.host import measure_host, store_host_profile

    path = host_profile_path()
    if dry_run:
        info(f"would measure this host (about 4 s) and write {path}")
        return {"path": str(path), "measured": False}
    info("measuring memory bandwidth and fp32 matrix throughput (a few seconds)...")
    profile = measure_host()
    store_host_profile(profile, path)
    info(
        f"cpu: {profile['memory_gb']:.1f} GiB RAM, {profile['bandwidth_gb_s']:.1f} GB/s, "
        f"{profile['fp32_tflops'] * 1e3:.1f} GFLOP/s fp32; stored in {path}"
    )
    return {"path": str(path), "measured": True, **profile}


def _write_json(path: Path, data: dict) -> None:
    write_json_atomic(path, data)
