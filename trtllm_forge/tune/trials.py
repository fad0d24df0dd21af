"""One trial: the config with a point's knob values, rendered, deployed and measured by forge's own bench.

Trials share the tune's workdir for import and build (each stage is skipped when its input hash is unchanged; a build
whose engine limits changed reuses the export), and render and deploy per trial. Each finished trial is kept in
`<workdir>/tune/trials/<config hash>/` (`trial.json`, `config.yaml`, the bench's outputs, the logs it wrote): a rerun
with the same config and bench settings reads it instead of running it again. A trial that fails (the server does not
come up, the bench stalls) is kept as failed with its error and logs, and the search goes on; Ctrl-C stops the trial's
server (the deployment's context) and leaves the finished trials.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trtllm_forge.atomic_files import write_json_atomic, write_text_atomic
from trtllm_forge.config.schema import ForgeConfig
from trtllm_forge.errors import ConfigError, ForgeError, StepError
from trtllm_forge.tune.config_file import config_hash, config_yaml
from trtllm_forge.tune.measure import LoadPoint, best_goodput, load_points, points_from_dicts
from trtllm_forge.tune.slo import Objective, Slo
from trtllm_forge.tune.space import Point
from trtllm_forge.ui import info, warn

TRIAL_FILE = "trial.json"
STALL_TIMEOUT_S = 30.0  # a trial whose requests all stop answering for this long is ended (recorded as failed)


@dataclass(frozen=True)
class BenchPlan:
    """How a trial is measured: the config's first workload with these loads and this many requests per load."""

    concurrencies: tuple[int, ...]
    num_requests: int
    warmup_requests: int = 2

    def to_dict(self) -> dict[str, Any]:
        return {"concurrency": list(self.concurrencies), "num_requests": self.num_requests, "warmup_requests": self.warmup_requests}


@dataclass
class TrialResult:
    hash: str
    point: Point
    status: str  # done | failed
    goodput: float  # 0 for a failed trial
    bench: dict[str, Any]  # BenchPlan.to_dict()
    points: list[LoadPoint] = field(default_factory=list)
    error: str | None = None
    seconds: float = 0.0
    directory: str = ""
    cached: bool = False  # read from an earlier run

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data.pop("cached")
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrialResult:
        fields = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in fields}
        values["points"] = points_from_dicts(values.get("points") or [])
        return cls(**values)

    @property
    def done(self) -> bool:
        return self.status == "done"


def trials_dir(workdir: Path) -> Path:
    return workdir / "tune" / "trials"


def trial_key(config: ForgeConfig, bench: BenchPlan, slo: Slo) -> str:
    return config_hash(config, {**bench.to_dict(), "slo": slo.to_dict()})


def cached_trial(workdir: Path, key: str) -> TrialResult | None:
    path = trials_dir(workdir) / key / TRIAL_FILE
    try:
        result = TrialResult.from_dict(json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None
    result.cached = True
    return result


def run_trial(config: ForgeConfig, point: Point, bench: BenchPlan, slo: Slo, objective: Objective, workdir: Path) -> TrialResult:
    """The trial's result: read from its directory when an earlier run finished it, else measured now."""
    key = trial_key(config, bench, slo)
    cached = cached_trial(workdir, key)
    if cached is not None:
        return cached
    final = trials_dir(workdir) / key
    scratch = final.with_name(f".{key}.tmp")
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    write_text_atomic(scratch / "config.yaml", config_yaml(config, f"tune trial {key}: {json.dumps(point)}"))
    started = time.time()
    result = TrialResult(key, point, "done", 0.0, bench.to_dict(), directory=str(final))
    try:
        document = _deploy_and_measure(config, workdir, bench, slo, scratch / "bench")
        result.points = load_points(document, slo, objective)
        result.goodput = best_goodput(result.points)
    except (StepError, ConfigError, TimeoutError, RuntimeError) as exc:
        result.status, result.error = "failed", _one_line(exc)
        warn(f"trial {key} failed: {result.error}")
    except BaseException:
        _keep_logs(workdir, scratch, started)
        shutil.rmtree(scratch, ignore_errors=True)  # an interrupted trial is not a finished one: the next run redoes it
        raise
    result.seconds = round(time.time() - started, 2)
    _keep_logs(workdir, scratch, started)
    write_json_atomic(scratch / TRIAL_FILE, result.to_dict())
    shutil.rmtree(final, ignore_errors=True)
    scratch.rename(final)
    return result


def _one_line(exc: BaseException) -> str:
    if isinstance(exc, ForgeError):
        return exc.format_message()
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _keep_logs(workdir: Path, scratch: Path, since: float) -> None:
    """Copies of the logs the trial wrote (the stages', the server's) into its directory."""
    logs = workdir / "logs"
    if not logs.is_dir():
        return
    for log in logs.rglob("*.log"):
        try:
            if log.stat().st_mtime >= since - 1:
                target = scratch / "logs" / log.relative_to(logs)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(log, target)
        except OSError:
            continue


def _deploy_and_measure(config: ForgeConfig, workdir: Path, bench: BenchPlan, slo: Slo, out: Path) -> dict[str, Any]:
    from trtllm_forge.bench.config_runs import options_from_config
    from trtllm_forge.bench.run import raise_if_interrupted, run_bench
    from trtllm_forge.builders.registry import build
    from trtllm_forge.deploy.kinds import kind_of
    from trtllm_forge.importer.stage import import_checkpoint
    from trtllm_forge.render.repository import render_repository

    imported = import_checkpoint(config, workdir)
    built = build(config, workdir, imported.checkpoint_dir)
    rendered = render_repository(config, workdir, built.engine_dir)
    with kind_of(config).serving(config, workdir, rendered.repository) as deployment:
        options = options_from_config(config, workdir, {}, deployment=deployment)[0]
        options = dataclasses.replace(
            options,
            concurrency=list(bench.concurrencies),
            request_rate=[],
            num_requests=bench.num_requests,
            warmup_requests=bench.warmup_requests,
            duration_s=None,
            slo=slo.per_request_ms(),
            out=out,
            plots=False,
            stall_timeout_s=STALL_TIMEOUT_S,
        )
        info(f"trial bench: concurrency {','.join(map(str, bench.concurrencies))}, {bench.num_requests} requests each")
        document = run_bench(options)
    raise_if_interrupted(document)
    aborted = [str(p["aborted"]) for p in document.get("points") or [document] if p.get("aborted")]
    if aborted:  # a stall (a hung or dead server): what it measured is kept in the trial's bench folder
        raise StepError("trial", f"the bench stopped early: {aborted[0]}", f"see {out} and the trial's logs")
    return document
