"""What a container must see of this host to serve a rendered repository: the repository and every path its models
read, each mounted read-only at the same path (so the rendered absolute paths stay true inside the container).

The paths are the absolute ones the repository's config.pbtxt files name as parameters (`gpt_model_path`,
`tokenizer_dir`, `EXECUTION_ENV_PATH`, ...). One of them inside this host's Python environment is refused: the
container has its own (the image's venv), and a repository rendered for `deploy.target: local` points its python
models at the host's (`EXECUTION_ENV_PATH`); render with `deploy.target: docker` for a container.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from trtllm_forge.errors import ConfigError, ConfigErrors
from trtllm_forge.render.stub_env import project_env


@dataclass(frozen=True)
class Mount:
    source: Path
    target: Path
    read_only: bool = True

    def volume(self) -> str:
        """The `-v` value (podman and docker)."""
        return f"{self.source}:{self.target}:{'ro' if self.read_only else 'rw'}"


@dataclass(frozen=True)
class PathParameter:
    """An absolute path a model's config.pbtxt names: where (file, parameter) and which path."""

    config: Path
    key: str
    path: Path


def path_parameters(repository: Path) -> list[PathParameter]:
    """Every parameter of every `*/config.pbtxt` whose value is an absolute path."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    found = []
    for config_path in sorted(repository.glob("*/config.pbtxt")):
        config = model_config_pb2.ModelConfig()
        try:
            text_format.Parse(config_path.read_text(errors="replace"), config)
        except (text_format.ParseError, ValueError) as exc:
            raise ConfigError(
                str(config_path), f"does not parse as a Triton model config: {exc}", "run `trtllm-forge render --check`"
            ) from None
        for key, value in sorted(config.parameters.items()):
            if value.string_value.startswith("/"):
                found.append(PathParameter(config_path, key, Path(value.string_value)))
    return found


def _inside(path: Path, directory: Path) -> bool:
    return path == directory or directory in path.parents


def repository_mounts(repository: Path, host_env: Path | None = None) -> list[Mount]:
    """The repository and the paths its models read, read-only at the same paths; a path nested in another
    mounted one is covered by it. ConfigErrors when a path is in the host's Python environment or missing."""
    repository = repository.resolve()
    host_env = (host_env or project_env()).resolve()
    problems = []
    paths = [repository]
    for parameter in path_parameters(repository):
        path = parameter.path.resolve()
        if _inside(path, host_env) or _inside(host_env, path):
            problems.append(
                ConfigError(
                    f"{parameter.config} parameter {parameter.key}",
                    f"{parameter.path} is this host's Python environment ({host_env}); the container has its own",
                    "render the repository with deploy.target: docker (no EXECUTION_ENV_PATH)",
                )
            )
        elif not path.exists():
            problems.append(
                ConfigError(
                    f"{parameter.config} parameter {parameter.key}",
                    f"{parameter.path} does not exist on this host, so it cannot be mounted into the container",
                    "render on this host after import and build, or fix the path",
                )
            )
        else:
            paths.append(path)
    if problems:
        raise ConfigErrors(problems) if len(problems) > 1 else problems[0]
    kept: list[Path] = []
    for path in sorted(set(paths), key=lambda p: len(p.parts)):
        if not any(_inside(path, outer) for outer in kept):
            kept.append(path)
    return [Mount(path, path) for path in sorted(kept)]
