"""Validate any Triton model repository (ours or hand-written): every problem at once, each with file,
line and a fix hint.

Checks: no `${` left in any file; every config.pbtxt parses as inference.ModelConfig; directory name =
model name; a version directory (with model.py for python models); dims and reshape as Triton 2.51 checks them
(its wrapping int64 element counts, the runs between -1 dims, no empty reshape without batching); EXECUTION_ENV_PATH
(a NUL byte ends it for Triton); duplicate tensors; ensemble steps refer to real models and tensors of matching dtype and dims, every required
input of a step is fed, every ensemble input feeds something, every ensemble output is produced exactly
once; no warm-up on an ensemble; ensemble max_batch_size <= every composing model's; decoupled
consistency (BLS vs engine model; streaming wired to a non-decoupled model; one step fed by two
decoupled models).
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from trtllm_forge.errors import ConfigError, ConfigErrors

PLACEHOLDER = "${"
TEXT_SUFFIXES = {".pbtxt", ".yaml", ".yml", ".json", ".py", ".txt", ".sh", ".j2"}
ENGINE_BACKENDS = {"tensorrtllm"}
STREAM_TENSORS = {"streaming", "stream"}
# Parameters whose empty value means "none" to NVIDIA's BLS (no draft engine model, no multimodal encoder).
EMPTY_MEANS_NONE = {"tensorrt_llm_draft_model_name", "multimodal_encoders_name"}


@dataclass
class Problem:
    file: str
    line: int
    message: str
    hint: str
    level: str = "error"  # or "warning"

    def as_error(self) -> ConfigError:
        return ConfigError(f"{self.file}:{self.line}", self.message, self.hint)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Tensor:
    name: str
    data_type: int
    dims: list[int]
    optional: bool = False


@dataclass
class Model:
    name: str
    directory: Path
    config_path: Path
    text: str
    config: Any  # inference.ModelConfig (tritonclient protobuf, untyped)

    @property
    def decoupled(self) -> bool:
        return bool(self.config.model_transaction_policy.decoupled)

    @property
    def is_ensemble(self) -> bool:
        return self.config.platform == "ensemble"

    def inputs(self) -> dict[str, Tensor]:
        return {i.name: Tensor(i.name, i.data_type, list(i.dims), i.optional) for i in self.config.input}

    def outputs(self) -> dict[str, Tensor]:
        return {o.name: Tensor(o.name, o.data_type, list(o.dims)) for o in self.config.output}

    def line_of(self, *needles: str) -> int:
        return line_of(self.text, *needles)


def line_of(text: str, *needles: str) -> int:
    """1-based line of the first needle found (trying them in order), else 1."""
    for needle in needles:
        index = text.find(needle)
        if index >= 0:
            return text.count("\n", 0, index) + 1
    return 1


def dtype_name(value: int) -> str:
    from tritonclient.grpc import model_config_pb2

    try:
        return model_config_pb2.DataType.Name(value)
    except ValueError:
        return f"data_type {value}"


def known_dtype(value: int) -> bool:
    from tritonclient.grpc import model_config_pb2

    return value in model_config_pb2.DataType.values() and value != 0


def dtype_choices() -> str:
    from tritonclient.grpc import model_config_pb2

    # protobuf's EnumTypeWrapper has keys() but is not iterable
    return ", ".join(name for name in model_config_pb2.DataType.keys() if name != "TYPE_INVALID")  # noqa: SIM118


def bad_dims(dims: list[int]) -> list[int]:
    """Dims Triton rejects: each is a size >= 1, or -1 for a variable size (model_config_utils ValidateIOShape)."""
    return [d for d in dims if d != -1 and d < 1]


INT64_BITS = 64


def _wrapped_int64(value: int) -> int:
    """`value` as Triton's int64_t arithmetic leaves it (two's complement wrap-around)."""
    value &= (1 << INT64_BITS) - 1
    return value - (1 << INT64_BITS) if value >> (INT64_BITS - 1) else value


def element_count(dims: list[int]) -> int:
    """triton::common::GetElementCount: -1 with a variable-size dimension, 0 for no dimensions, else the
    product in int64 (it wraps: Triton compares wrapped counts, so we do too)."""
    if -1 in dims:
        return -1
    return _wrapped_int64(math.prod(dims)) if dims else 0


def _trunk_counts(dims: list[int]) -> list[int]:
    """Element counts of the runs of fixed dimensions between variable-size ones (int64, wrapping)."""
    counts, current = [], 1
    for dim in dims:
        if dim == -1:
            counts.append(current)
            current = 1
        else:
            current = _wrapped_int64(current * dim)
    return [*counts, current]


def reshape_problem(dims: list[int], shape: list[int], batching: bool) -> tuple[str, str] | None:
    """What Triton 2.51 refuses in a tensor's reshape (model_config_utils.cc ValidateIOShape, checked against the
    server in tests/test_input_hardening.py): (problem, fix), or None when it loads."""
    if not batching and not shape:
        return (
            "an empty reshape on a model without batching (Triton: scalar tensors are not supported)",
            "set max_batch_size > 0, or reshape to [1]",
        )
    dims_count, shape_count = element_count(dims), element_count(shape)
    if dims_count != shape_count and (shape_count != 0 or dims_count != 1):
        return f"reshape {shape} has a different element count than dims {dims}", "make reshape hold as many elements as dims"
    if dims_count == -1:
        dims_trunks, shape_trunks = _trunk_counts(dims), _trunk_counts(shape)
        if len(dims_trunks) != len(shape_trunks):
            return f"reshape {shape} has another number of variable-size (-1) dimensions than dims {dims}", "use as many -1 in both"
        if dims_trunks != shape_trunks:
            return (
                f"reshape {shape} has a different element count than dims {dims} between the variable-size (-1) dimensions",
                "make each run of fixed dimensions hold as many elements in both",
            )
    return None


def dims_compatible(a: list[int], b: list[int]) -> bool:
    return len(a) == len(b) and all(x == y or x == -1 or y == -1 for x, y in zip(a, b, strict=False))


class Validator:
    def __init__(self, repository: Path):
        self.repository = repository
        self.problems: list[Problem] = []
        self.models: dict[str, Model] = {}
        self.unreadable: set[str] = set()  # models whose config.pbtxt did not parse (already reported)

    def rel(self, path: Path) -> str:
        try:
            return str(path.relative_to(self.repository.parent))
        except ValueError:
            return str(path)

    def add(self, path: Path, line: int, message: str, hint: str, level: str = "error") -> None:
        self.problems.append(Problem(self.rel(path), line, message, hint, level))

    # --- per file and per model ------------------------------------------------------------------------

    def scan_placeholders(self) -> None:
        for path in sorted(self.repository.rglob("*")):
            if not path.is_file() or path.suffix not in TEXT_SUFFIXES or path.suffix == ".py":
                continue
            text = path.read_text(errors="replace")
            for number, line in enumerate(text.splitlines(), start=1):
                if PLACEHOLDER in line and not line.lstrip().startswith("#"):
                    name = re.search(r"\$\{([^}]*)\}", line)
                    self.add(
                        path,
                        number,
                        f"unfilled template placeholder {name.group(0) if name else '${'}",
                        "fill it with a typed value or remove the entry (trtllm-forge render never leaves one)",
                    )

    def load_models(self) -> None:
        from google.protobuf import text_format
        from tritonclient.grpc import model_config_pb2

        for directory in sorted(p for p in self.repository.iterdir() if p.is_dir() and not p.name.startswith(".")):
            config_path = directory / "config.pbtxt"
            if not config_path.is_file():
                self.add(
                    directory,
                    1,
                    "model directory without config.pbtxt",
                    "add a complete config.pbtxt (the server runs with --disable-auto-complete-config) or remove the directory",
                )
                continue
            text = config_path.read_text(errors="replace")
            config = model_config_pb2.ModelConfig()
            try:
                text_format.Parse(text, config)
            except (text_format.ParseError, ValueError, RecursionError) as exc:  # ValueError: e.g. an int32 out of range
                numbers = re.findall(r"-?\d{6,}", str(exc))
                line = (exc.GetLine() if isinstance(exc, text_format.ParseError) else None) or line_of(text, *numbers[:1])
                self.add(
                    config_path,
                    line,
                    f"does not parse as inference.ModelConfig: {exc}",
                    "fix the syntax; unfilled ${...} in typed fields are the usual cause",
                )
                self.unreadable.add(directory.name)
                continue
            model = Model(config.name or directory.name, directory, config_path, text, config)
            if config.name and config.name != directory.name:
                self.add(
                    config_path,
                    model.line_of("name:"),
                    f"model name {config.name!r} differs from its directory {directory.name!r}",
                    f'rename the directory or set name: "{directory.name}"',
                )
            self.models[directory.name] = model
            self.check_model(model)

    def check_model(self, model: Model) -> None:
        cfg, path = model.config, model.config_path
        if not cfg.backend and not cfg.platform:
            self.add(path, 1, "neither backend nor platform is set", 'set backend: "python" (or the right backend) or platform: "ensemble"')
        versions = [p for p in model.directory.iterdir() if p.is_dir() and p.name.isdigit()]
        if not versions:
            self.add(model.directory, 1, "no version directory (e.g. 1/)", f"create {model.directory.name}/1/ (with a .gitkeep if empty)")
        elif cfg.backend == "python":
            filename = cfg.default_model_filename or "model.py"
            for version in versions:
                if not (version / filename).is_file():
                    self.add(version, 1, f"python model without {filename}", f"put the model's {filename} into {version.name}/")
        env = cfg.parameters.get("EXECUTION_ENV_PATH")
        if env is not None and env.string_value:
            self.check_execution_env(model, env.string_value)
        for key, value in cfg.parameters.items():
            if value.string_value == "" and key not in EMPTY_MEANS_NONE:
                self.add(
                    path,
                    model.line_of(f'"{key}"'),
                    f"parameter {key!r} is empty",
                    "give it a value or remove it; backends silently fall back to a default",
                    "warning",
                )
        for kind, tensors in (("input", cfg.input), ("output", cfg.output)):
            seen: set[str] = set()
            for tensor in tensors:
                if tensor.name in seen:
                    level = "warning" if kind == "output" else "error"
                    self.add(
                        path,
                        model.line_of(f'"{tensor.name}"'),
                        f"{kind} {tensor.name!r} is declared twice",
                        "declare each tensor once",
                        level,
                    )
                seen.add(tensor.name)
                if tensor.data_type == 0:
                    self.add(
                        path,
                        model.line_of(f'"{tensor.name}"'),
                        f"{kind} {tensor.name!r} has no data_type",
                        "set data_type (e.g. TYPE_INT32)",
                    )
                elif not known_dtype(tensor.data_type):
                    self.add(
                        path,
                        model.line_of(f'"{tensor.name}"'),
                        f"{kind} {tensor.name!r} has data_type {tensor.data_type}, which is not a Triton data type",
                        f"one of {dtype_choices()}",
                    )
                if not len(tensor.dims):
                    self.add(
                        path,
                        model.line_of(f'"{tensor.name}"'),
                        f"{kind} {tensor.name!r} has no dims (Triton: must specify 'dims')",
                        "list its dimensions, e.g. dims: [1] (-1 for a variable size)",
                    )
                for field, dims in (("dims", list(tensor.dims)), ("reshape", list(tensor.reshape.shape))):
                    if bad_dims(dims):
                        self.add(
                            path,
                            model.line_of(f'"{tensor.name}"'),
                            f"{kind} {tensor.name!r} has {field} {dims}",
                            "each dimension is a size of at least 1, or -1 for a variable size",
                        )
                if tensor.HasField("reshape") and not bad_dims(list(tensor.dims)) and not bad_dims(list(tensor.reshape.shape)):
                    problem = reshape_problem(list(tensor.dims), list(tensor.reshape.shape), batching=cfg.max_batch_size > 0)
                    if problem is not None:
                        self.add(path, model.line_of(f'"{tensor.name}"'), f"{kind} {tensor.name!r}: {problem[0]}", problem[1])
        if model.is_ensemble and len(cfg.model_warmup):
            self.add(path, model.line_of("model_warmup"), "model_warmup is not allowed on an ensemble", "remove model_warmup")

    def check_execution_env(self, model: Model, value: str) -> None:
        """EXECUTION_ENV_PATH as Triton 2.51's python backend reads it (checked against the server in
        tests/test_input_hardening.py): a C string, so a NUL byte ends it; an empty path is refused on every host
        ('Failed to get the canonical path for '); a path missing here may exist on the serving host."""
        path, line = model.config_path, model.line_of("EXECUTION_ENV_PATH")
        if model.config.backend != "python":
            self.add(
                path,
                line,
                f"EXECUTION_ENV_PATH is a python-backend parameter; backend {model.config.backend!r} ignores it",
                "remove it",
                "warning",
            )
            return
        read = value.split("\0", 1)[0]
        if "\0" in value:
            if not read:
                self.add(
                    path,
                    line,
                    f"EXECUTION_ENV_PATH {value!r} starts with a NUL byte: Triton reads an empty path and refuses the model",
                    "write the path of the Python environment without control characters",
                )
                return
            self.add(
                path,
                line,
                f"EXECUTION_ENV_PATH {value!r} holds a NUL byte: Triton reads only {read!r}",
                "remove the NUL byte and what follows it",
                "warning",
            )
        if not Path(read).exists():
            self.add(
                path,
                line,
                f"EXECUTION_ENV_PATH {read!r} does not exist here",
                "re-render on the serving host, or point it at the Python environment the stub should use",
                "warning",
            )

    # --- across models -----------------------------------------------------------------------------------

    def check_ensemble(self, ens: Model) -> None:
        path = ens.config_path
        ens_inputs, ens_outputs = ens.inputs(), ens.outputs()
        available: dict[str, Tensor] = dict(ens_inputs)
        producers: dict[str, str] = {}
        decoupled_origin: dict[str, set[str]] = {name: set() for name in ens_inputs}
        fed: set[str] = set()
        steps = list(ens.config.ensemble_scheduling.step)
        if not steps:
            self.add(path, 1, "ensemble without ensemble_scheduling steps", "add the steps that chain the models")
        # Steps may be listed in any order: resolve producers first.
        for step in steps:
            target = self.models.get(step.model_name)
            if target is None:
                continue
            outputs = target.outputs()
            for key, value in step.output_map.items():
                if key in outputs:
                    if value in producers and value not in ens_inputs:
                        self.add(
                            path,
                            ens.line_of(f'value: "{value}"'),
                            f"ensemble tensor {value!r} is produced twice ({producers[value]} and {step.model_name})",
                            "map each ensemble tensor from one output only",
                        )
                    producers[value] = step.model_name
                    available.setdefault(value, outputs[key])
        for step in steps:
            if step.model_name in self.unreadable:  # its own parse error is reported; do not cascade
                fed.update(step.input_map.values())
                producers.update({value: step.model_name for value in step.output_map.values()})
                continue
        for step in steps:
            target = self.models.get(step.model_name)
            step_line = ens.line_of(f'model_name: "{step.model_name}"')
            if step.model_name in self.unreadable:
                continue
            if target is None:
                self.add(
                    path, step_line, f"step model {step.model_name!r} is not in the repository", f"add {step.model_name}/ or fix model_name"
                )
                continue
            if target.config.max_batch_size and ens.config.max_batch_size > target.config.max_batch_size:
                self.add(
                    path,
                    ens.line_of("max_batch_size"),
                    f"ensemble max_batch_size {ens.config.max_batch_size} is above {step.model_name}'s {target.config.max_batch_size}",
                    f"use at most {target.config.max_batch_size}",
                )
            inputs, outputs = target.inputs(), target.outputs()
            origins: set[str] = set()
            for key, value in step.input_map.items():
                line = ens.line_of(f'key: "{key}" value: "{value}"', f'"{key}"')
                if key not in inputs:
                    self.add(
                        path,
                        line,
                        f"step {step.model_name}: {key!r} is not an input of {step.model_name}",
                        f"inputs are: {', '.join(sorted(inputs)) or 'none'}",
                    )
                    continue
                source = available.get(value)
                if source is None and producers.get(value) in self.unreadable:
                    fed.add(value)  # made by a model whose config.pbtxt did not parse: reported there, not here
                    continue
                if source is None:
                    self.add(
                        path,
                        line,
                        f"step {step.model_name}: {value!r} is neither an ensemble input nor produced by a step",
                        "map an ensemble input or an output of another step",
                    )
                    continue
                fed.add(value)
                origins |= decoupled_origin.get(value, set())
                want = inputs[key]
                if want.data_type != source.data_type:
                    self.add(
                        path,
                        line,
                        f"step {step.model_name}: {value!r} is {dtype_name(source.data_type)} but input {key!r} "
                        f"is {dtype_name(want.data_type)}",
                        "make the data types equal",
                    )
                elif not dims_compatible(want.dims, source.dims):
                    self.add(
                        path,
                        line,
                        f"step {step.model_name}: {value!r} has dims {source.dims} but input {key!r} has dims {want.dims}",
                        "make the dims agree (-1 matches any size)",
                    )
                if key in STREAM_TENSORS and not target.decoupled:
                    # A repository that is decoupled nowhere is a valid non-streaming deployment (warning); one
                    # where other models are decoupled means streaming clients, which this step rejects (error).
                    streaming_elsewhere = sorted(m.name for m in self.models.values() if m.decoupled and m is not target)
                    self.add(
                        path,
                        line,
                        f"streaming is wired to {step.model_name}, which is not decoupled; streamed requests "
                        "fail with 'Streaming is only supported if model is deployed using decoupled mode'"
                        + (f" (while {', '.join(streaming_elsewhere)} is decoupled)" if streaming_elsewhere else ""),
                        f"set model_transaction_policy {{ decoupled: true }} in {step.model_name}, or do not map {key!r}",
                        "error" if streaming_elsewhere else "warning",
                    )
            if len(origins) > 1:
                self.add(
                    path,
                    step_line,
                    f"step {step.model_name} receives inputs from different decoupled models ({', '.join(sorted(origins))})",
                    "feed a step from at most one decoupled model",
                )
            mapped = set(step.input_map.keys())
            for name, tensor in inputs.items():
                if not tensor.optional and name not in mapped:
                    self.add(
                        path,
                        step_line,
                        f"step {step.model_name}: required input {name!r} is not mapped",
                        f'add input_map {{ key: "{name}" value: "..." }}',
                    )
            for key, value in step.output_map.items():
                line = ens.line_of(f'key: "{key}" value: "{value}"', f'"{key}"')
                if key not in outputs:
                    self.add(
                        path,
                        line,
                        f"step {step.model_name}: {key!r} is not an output of {step.model_name}",
                        f"outputs are: {', '.join(sorted(outputs)) or 'none'}",
                    )
                    continue
                origin = {step.model_name} if target.decoupled else origins
                decoupled_origin[value] = set(origin)
                if value in ens_outputs:
                    want = ens_outputs[value]
                    if want.data_type != outputs[key].data_type:
                        self.add(
                            path,
                            line,
                            f"ensemble output {value!r} is {dtype_name(want.data_type)} but {step.model_name} "
                            f"produces {dtype_name(outputs[key].data_type)}",
                            "make the data types equal",
                        )
                    elif not dims_compatible(want.dims, outputs[key].dims):
                        self.add(
                            path,
                            line,
                            f"ensemble output {value!r} has dims {want.dims} but {step.model_name}.{key} has {outputs[key].dims}",
                            "make the dims agree",
                        )
        for kind, declared, mapped, problem, hint in (
            ("input", ens_inputs, fed, "feeds no step", "map it in a step's input_map or remove it"),
            ("output", ens_outputs, set(producers), "is produced by no step", "map a step output to it or remove it"),
        ):
            for name in declared:
                if name not in mapped:
                    self.add(path, ens.line_of(f'name: "{name}"'), f"ensemble {kind} {name!r} {problem}", hint)

    def check_decoupled_pairs(self) -> None:
        for model in self.models.values():
            if model.config.backend != "python" or "text_input" not in model.inputs() or model.is_ensemble:
                continue
            engine = self.model_named_by(model, "tensorrt_llm_model_name", "fix the parameter")
            if engine is None:
                continue
            if model.decoupled and not engine.decoupled:
                self.add(
                    model.config_path,
                    model.line_of("decoupled"),
                    f"{model.name} is decoupled but {engine.name} is not; its streamed calls to the engine fail",
                    f"set decoupled: true in {engine.name} too (or false in {model.name})",
                )
            if "stream" in model.inputs() and not model.decoupled and engine.decoupled:
                self.add(
                    model.config_path,
                    model.line_of("decoupled"),
                    f"{engine.name} is decoupled but {model.name} is not; streamed requests to {model.name} fail",
                    f"set decoupled: true in {model.name}",
                )
            self.check_draft_model(model)

    def model_named_by(self, model: Model, parameter: str, hint: str) -> Model | None:
        """The model that `parameter` of `model` names; a problem when it is not in the repository."""
        named = model.config.parameters.get(parameter)
        if named is None:
            return None
        found = self.models.get(named.string_value)
        if found is None:
            self.add(model.config_path, model.line_of(parameter), f"{parameter} {named.string_value!r} is not in the repository", hint)
        return found

    def check_draft_model(self, bls: Model) -> None:
        """The draft engine model a BLS names must be there and not decoupled: the BLS calls it with exec()
        (decoupled=False), as NVIDIA's draft-target loop does (render/draft.py)."""
        name = bls.config.parameters.get("tensorrt_llm_draft_model_name")
        if name is None or not name.string_value:
            return
        draft = self.model_named_by(bls, "tensorrt_llm_draft_model_name", "fix the parameter, or leave it empty for no drafting")
        if draft is not None and draft.decoupled:
            self.add(
                draft.config_path,
                draft.line_of("decoupled"),
                f"{draft.name} is decoupled, but {bls.name} calls the draft model without a response stream",
                f"set decoupled: false in {draft.name}",
            )

    def run(self) -> list[Problem]:
        try:
            self.repository.stat()
        except OSError as exc:  # a symlink loop, no permission, a name too long
            if not isinstance(exc, FileNotFoundError):
                self.add(
                    self.repository, 1, f"cannot be read ({exc.strerror or exc})", "pass a readable directory holding the model folders"
                )
                return self.problems
        if not self.repository.is_dir():
            self.add(self.repository, 1, "repository directory does not exist", "pass the directory holding the model folders")
            return self.problems
        self.scan_placeholders()
        self.load_models()
        if not self.models and not self.problems:
            self.add(self.repository, 1, "no models found", "a repository holds one directory per model")
        for model in self.models.values():
            if model.is_ensemble:
                self.check_ensemble(model)
        self.check_decoupled_pairs()
        return self.problems


def check_repository(repository: Path) -> list[Problem]:
    """All problems (errors and warnings) of the repository at `repository`."""
    return Validator(Path(repository)).run()


def raise_on_errors(problems: list[Problem]) -> None:
    errors = [p.as_error() for p in problems if p.level == "error"]
    if len(errors) == 1:
        raise errors[0]
    if errors:
        raise ConfigErrors(errors)
