"""Each `bench` option defined once: `BenchOptions`' fields carry their flag, config key, help text, range and choices.

From this one definition come the `bench run` flags (`click_options`), the config schema's `bench.workloads[]`
entries (`workload_fields`, used by config/schema.py) and the mapping of a workload or of the command line to
`BenchOptions` (`from_workload`, `from_command_line`). It sits below the config (config/schema.py imports it), so it
imports only bench/specs.py and errors of ours; kept light: `--help` must not load numpy or tritonclient.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from pydantic import Field

from trtllm_forge.bench.specs import LengthSpec, LoadSpec
from trtllm_forge.errors import ConfigError

Target = Literal["triton-grpc", "triton-grpc-tokens", "triton-http", "openai"]
Arrival = Literal["constant", "poisson", "gamma"]
OpenAIEndpoint = Literal["completions", "chat"]
SloKind = Literal["ttft", "tpot", "e2e"]
TARGETS, ARRIVALS, OPENAI_ENDPOINTS, SLO_KINDS = (get_args(kind) for kind in (Target, Arrival, OpenAIEndpoint, SloKind))
SAME = object()  # Option.config_default: the same as BenchOptions'


def _numbers(text: str | None, flag: str, kind: type = int) -> list:
    if not text:
        return []
    try:
        values = [kind(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(flag, f"{text!r} is not a comma-separated list of numbers", f"e.g. {flag} 1,4,16") from None
    if any(v <= 0 for v in values):
        raise ConfigError(flag, "values must be > 0", f"e.g. {flag} 1,4,16")
    return values


def _slo(items: tuple[str, ...], flag: str) -> dict[str, float]:
    slo = {}
    for item in items:
        key, _, value = item.partition(":")
        try:
            if key not in SLO_KINDS:
                raise ValueError
            slo[key] = float(value)
        except ValueError:
            raise ConfigError(flag, f"{item!r} is not an SLO", "use ttft:MS, tpot:MS or e2e:MS (repeatable)") from None
    return slo


def _length(text: str | int | None, where: str) -> LengthSpec | None:
    return None if text is None else LengthSpec.parse(text, where)


def _default_length(tokens: int) -> Callable[[], LengthSpec]:
    def make() -> LengthSpec:
        return LengthSpec(tokens)

    return make


@dataclass(frozen=True)
class Option:
    """How one BenchOptions field appears on the command line and in the config's `bench.workloads[]`."""

    help: str  # the flag's --help text; with `show_default`, " Default X." is added from the default
    flag: str | None = None  # `bench run` flag; None: not on the command line
    key: str | None = None  # key in bench.workloads[]; None: not in the config
    description: str | None = None  # the config schema's text, where it differs from `help`
    config_type: Any = None  # the YAML value's type (a `path` option's: the schema's LocalPath, see workload_fields)
    config_default: Any = SAME  # the config's default where it differs from BenchOptions'
    show_default: bool = False  # say the default at the end of --help (the flag itself defaults to "not given")
    flag_default: bool = False  # the flag defaults to the field's default (click's show_default) instead of "not given"
    ge: float | None = None
    gt: float | None = None
    choices: tuple[str, ...] | None = None
    click_type: Any = None  # click's type for the flag's text, when not derived from choices/ge/gt/path
    path: dict[str, bool] | None = None  # the flag is a click.Path with these checks (dir_okay=False, ...)
    multiple: bool = False
    negate: bool = False  # a --no-... flag that sets a default-True field to False
    from_flag: Callable[[Any, str], Any] | None = None  # (text as click gives it, flag) -> value
    from_config: Callable[[Any, str], Any] | None = None  # (YAML value, "bench.workloads[name].key") -> value


def option(default: Any = dataclasses.MISSING, *, factory: Any = dataclasses.MISSING, **spec: Any) -> Any:
    metadata = {"option": Option(**spec)}
    if factory is not dataclasses.MISSING:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


def _length_option(tokens: int, flag: str, key: str, what: str) -> Any:
    """A token length (LengthSpec), on the command line and in the config; `tokens` is its default mean."""
    return option(
        factory=_default_length(tokens),
        flag=flag,
        from_flag=_length,
        show_default=True,
        help=f"{what} tokens: MEAN, MEAN:STD or LO..HI.",
        key=key,
        config_type=int | str,
        config_default=tokens,
        from_config=_length,
        description=f"{what} tokens: MEAN, 'MEAN:STD' or 'LO..HI'.",
    )


@dataclass(kw_only=True)
class BenchOptions:
    """One benchmark run: the endpoint, the load (a sweep of points), the workload and the outputs.

    Field order is the order of the flags in `bench run --help` and of the keys in the config schema."""

    target: str = option(
        "triton-grpc",
        flag="--target",
        choices=TARGETS,
        show_default=True,
        help="Endpoint kind.",
        key="target",
        config_type=Target,
        description="Endpoint kind the workload is sent to.",
    )
    url: str = option(flag="--url", help="gRPC host:port, or http://host:port for the HTTP targets. Default: the workdir's deployment.")
    model: str = option(flag="--model", help="Model name (ensemble, tensorrt_llm_bls, tensorrt_llm; the served name for openai).")
    concurrency: list[int] = option(
        factory=list,
        flag="--concurrency",
        from_flag=_numbers,
        help="Closed-loop concurrencies, comma-separated (a sweep).",
        key="concurrency",
        config_type=list[Annotated[int, Field(ge=1)]],
        config_default=[1],
        from_config=lambda value, where: list(value),
        description="Closed-loop concurrencies to sweep.",
    )
    request_rate: list[float] = option(
        factory=list,
        flag="--request-rate",
        from_flag=lambda text, flag: _numbers(text, flag, float),
        help="Open-loop request rates in requests/s, comma-separated (a sweep).",
        key="request_rate",
        config_type=list[Annotated[float, Field(gt=0)]],
        from_config=lambda value, where: list(value),
        description="Open-loop request rates (requests/s) to sweep; used instead of concurrency when concurrency is empty.",
    )
    arrival: str = option(
        "poisson",
        flag="--arrival",
        choices=ARRIVALS,
        show_default=True,
        help="Open-loop arrivals.",
        key="arrival",
        config_type=Arrival,
        description="Open-loop arrival process.",
    )
    burstiness: float = option(1.0, flag="--burstiness", gt=0, show_default=True, help="Gamma shape (1 = Poisson).")
    max_concurrency: int | None = option(None, flag="--max-concurrency", ge=1, help="Cap on requests in flight in open loop.")
    num_requests: int = option(
        32,
        flag="--num-requests",
        ge=1,
        show_default=True,
        help="Measured requests per sweep point.",
        key="num_requests",
        config_type=int,
    )
    duration_s: float | None = option(
        None,
        flag="--duration",
        gt=0,
        help="Stop sending after S seconds per point.",
        key="duration_s",
        config_type=float | None,
        description="Stop sending after this many seconds per sweep point.",
    )
    warmup_requests: int = option(
        2,
        flag="--warmup",
        ge=0,
        show_default=True,
        help="Warm-up requests (distinct prompts, excluded).",
        key="warmup_requests",
        config_type=int,
        description="Warm-up requests (distinct prompts), excluded from the results.",
    )
    input_len: LengthSpec = _length_option(128, "--input-len", "input_len", "Prompt")
    output_len: LengthSpec = _length_option(64, "--output-len", "output_len", "Output")
    output_len_given: bool = False  # the output length was set (a dataset then uses it instead of its own)
    prefix_len: int = option(
        0,
        flag="--prefix-len",
        ge=0,
        show_default=True,
        help="Tokens of one system prompt every synthetic prompt starts with (a shared prefix for prefix caching).",
        key="prefix_len",
        config_type=int,
        description="Tokens of one system prompt every synthetic prompt starts with (0: none).",
    )
    prefix_count: int = option(
        1,
        flag="--prefix-count",
        ge=1,
        show_default=True,
        help="Distinct system prompts of --prefix-len tokens; session s starts with prompt s mod this (more prefixes "
        "than one engine's KV cache holds is where cache-aware routing pays).",
        key="prefix_count",
        config_type=int,
        description="Distinct system prompts of prefix_len tokens, taken by the sessions in turn (1: one shared prompt).",
    )
    turns: int = option(
        1,
        flag="--turns",
        ge=1,
        show_default=True,
        help="Turns per session: turn k's prompt is the session's earlier turns (each question followed by an answer "
        "of the output length) plus a new question of the prompt length.",
        key="turns",
        config_type=int,
        description="Turns per synthetic session (1: independent prompts); a session's prompts grow by its earlier turns.",
    )
    dataset: Path | None = option(
        None,
        flag="--dataset",
        path=dict(dir_okay=False),
        help="JSONL {prompt|input_ids, output_tokens} or ShareGPT JSON.",
        key="dataset",
        # config_type: a path option's is the schema's LocalPath (workload_fields)
        from_config=lambda value, where: Path(value) if value else None,
        description="JSONL {prompt|input_ids, output_tokens} or ShareGPT file instead of synthetic prompts.",
    )
    tokenizer: Path | None = option(
        None,
        flag="--tokenizer",
        path=dict(file_okay=False),
        help="HF tokenizer directory (exact prompt lengths, token counts).",
    )
    seed: int = option(
        0,
        flag="--seed",
        click_type=int,
        show_default=True,
        help="Seed for prompts, lengths and arrivals (0 is a real seed).",
        key="seed",
        config_type=int,
        description="Seed for prompts, lengths and arrivals.",
    )
    out: Path = option(
        Path("bench-out"),
        flag="--out",
        path=dict(file_okay=False),
        help="Output directory. Default <workdir>/bench/<workload> or ./bench-out.",
    )
    slo: dict[str, float] = option(
        factory=dict,
        flag="--slo",
        multiple=True,
        from_flag=_slo,
        help="Goodput SLO: ttft:MS, tpot:MS or e2e:MS (repeatable).",
        key="slo_ms",
        config_type=dict[SloKind, float],
        from_config=lambda value, where: dict(value),
        description="Goodput SLOs in ms.",
    )
    metrics_url: str | None = option(None, flag="--metrics-url", help="Triton Prometheus URL to scrape. Default: the deployment's.")
    workers: int = option(1, flag="--workers", ge=1, flag_default=True, help="Client processes to shard the load over.")
    streams: int | None = option(
        None,
        flag="--streams",
        ge=1,
        help="ModelStreamInfer streams kept open (an HTTP/2 connection and its reader thread each) to spread requests "
        "over; a stream carries several requests when more are in flight. Default: one per request in flight, at most 16.",
    )
    stall_timeout_s: float = option(
        60.0,
        flag="--stall-timeout",
        gt=0,
        flag_default=True,
        help="Abort a point when no request in flight has received anything for this many seconds.",
    )
    force_output_len: bool = option(
        True, flag="--no-force-output-len", negate=True, help="Do not force the output length (min_tokens/end_id, ignore_eos)."
    )
    request_timeout_s: float = option(600.0, flag="--request-timeout", gt=0, flag_default=True, help="Seconds per request.")
    plots: bool = option(True, flag="--no-plots", negate=True, help="Skip the PNG plots.")
    openai_endpoint: str = option(
        "completions", flag="--openai-endpoint", choices=OPENAI_ENDPOINTS, flag_default=True, help="For --target openai."
    )
    http_url: str | None = None  # the deployment's HTTP URL (for emitted AIPerf commands)
    # (server process group, model repository) of the Triton deployment measured, when the bench found it in the
    # workdir: a stall asks its python stubs (bench/runner.py StubCheck). None with a bare --url.
    server_stubs: tuple[int, str] | None = None

    def loads(self) -> list[LoadSpec]:
        common: dict[str, Any] = dict(num_requests=self.num_requests, duration_s=self.duration_s, warmup_requests=self.warmup_requests)
        points = [LoadSpec("concurrency", c, **common) for c in self.concurrency]
        points += [LoadSpec("rate", r, self.arrival, self.burstiness, self.max_concurrency, **common) for r in self.request_rate]
        return points or [LoadSpec("concurrency", 1, **common)]

    def describe(self) -> dict:
        data = {k: (str(v) if isinstance(v, Path) else v) for k, v in self.__dict__.items()}
        data["input_len"] = self.input_len.describe()
        data["output_len"] = self.output_len.describe()
        return data


OPTIONS: dict[str, Option] = {f.name: f.metadata["option"] for f in dataclasses.fields(BenchOptions) if "option" in f.metadata}


def _default(name: str) -> Any:
    """BenchOptions' default of a field (made from its factory if it has one)."""
    spec = next(f for f in dataclasses.fields(BenchOptions) if f.name == name)
    if spec.default_factory is not dataclasses.MISSING:
        return spec.default_factory()
    return spec.default


def _annotation(name: str) -> str:
    """The field's annotation as written ("int | None"): postponed annotations are strings, and resolving them would
    import LengthSpec's numpy."""
    return str(next(f for f in dataclasses.fields(BenchOptions) if f.name == name).type)


def _shown(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    return value.describe() if hasattr(value, "describe") else str(value)


# ---- the command line ------------------------------------------------------------------------------------------


def _click_option(name: str, spec: Option) -> Callable:
    import click

    assert spec.flag is not None
    kwargs: dict[str, Any] = {"help": spec.help}
    if spec.negate:
        kwargs.update(is_flag=True, flag_value=False, default=True)
        return click.option(spec.flag, name, **kwargs)
    kind = spec.click_type
    if spec.choices is not None:
        kind = click.Choice(spec.choices)
    elif spec.path is not None:
        kind = click.Path(path_type=Path, **spec.path)
    elif spec.ge is not None or spec.gt is not None:
        low = spec.ge if spec.ge is not None else (spec.gt or 0)
        is_int = _annotation(name).startswith("int")
        kind = (
            click.IntRange(min=int(low), min_open=spec.gt is not None)
            if is_int
            else click.FloatRange(min=low, min_open=spec.gt is not None)
        )
    if kind is not None:
        kwargs["type"] = kind
    if spec.multiple:
        kwargs["multiple"] = True
    elif spec.flag_default:
        kwargs.update(default=_default(name), show_default=True)
    else:
        kwargs["default"] = None
        if spec.show_default:
            kwargs["help"] = f"{spec.help} Default {_shown(spec.config_default if spec.config_default is not SAME else _default(name))}."
    return click.option(spec.flag, name, **kwargs)


def click_options(insert_before: dict[str, list[Callable]] | None = None) -> Callable:
    """Decorator: one click option per BenchOptions field with a flag, in field order, named by the field.
    `insert_before` puts other options (not BenchOptions fields) before a field's flag in --help."""
    insert_before = insert_before or {}
    decorators: list[Callable] = []
    for name, spec in OPTIONS.items():
        decorators += insert_before.get(name, [])
        if spec.flag is not None:
            decorators.append(_click_option(name, spec))

    def apply(command: Callable) -> Callable:
        for decorator in reversed(decorators):  # click lists options in the order their decorators are written
            command = decorator(command)
        return command

    return apply


def from_command_line(values: dict[str, Any]) -> dict[str, Any]:
    """The flags' values by field, converted (`--concurrency 1,4` -> [1, 4]); options not given are left out."""
    given: dict[str, Any] = {}
    for name, spec in OPTIONS.items():
        if spec.flag is None or name not in values:
            continue
        value = values[name]
        if spec.from_flag is not None and value not in (None, ()):
            value = spec.from_flag(value, spec.flag)
        if value is None or value == [] or value == {} or value == ():
            continue
        given[name] = value
    return given


# ---- the config's bench.workloads[] --------------------------------------------------------------------------------


def workload_fields(local_path: Any) -> dict[str, Any]:
    """pydantic field definitions {key: (type, Field)} of bench.workloads[], for config/schema.py's create_model.
    `local_path` is the schema's type of a path on this machine: the options that name a file (`path`) take it in place
    of `str` (the schema checks its paths; this module sits below it and cannot import it)."""
    fields: dict[str, Any] = {}
    for name, spec in OPTIONS.items():
        if spec.key is None:
            continue
        default = spec.config_default if spec.config_default is not SAME else _default(name)
        config_type = spec.config_type
        if spec.path is not None:
            config_type = local_path if default is not None else local_path | None
        kwargs: dict[str, Any] = {"description": spec.description or spec.help}
        kwargs.update({bound: value for bound, value in (("ge", spec.ge), ("gt", spec.gt)) if value is not None})
        if isinstance(default, (list, dict)):
            kwargs["default_factory"] = partial(copy.copy, default)
        else:
            kwargs["default"] = default
        fields[spec.key] = (config_type, Field(**kwargs))
    return fields


def from_workload(workload: Any, where: str) -> dict[str, Any]:
    """The workload's keys as BenchOptions fields, converted (input_len "16..32" -> LengthSpec); `where` names it in errors."""
    values: dict[str, Any] = {}
    for name, spec in OPTIONS.items():
        if spec.key is None:
            continue
        value = getattr(workload, spec.key)
        values[name] = spec.from_config(value, f"{where}.{spec.key}") if spec.from_config is not None else value
    return values


def mean_lengths(workload: Any) -> tuple[int, int]:
    """A workload's prompt and output tokens as one number each: the mean of its MEAN, MEAN:STD or LO..HI (rounded down)."""
    values = from_workload(workload, f"bench.workloads[{workload.name}]")
    return int(values["input_len"].mean), int(values["output_len"].mean)
