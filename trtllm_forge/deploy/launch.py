"""What a local start runs: the server argv, its environment, ports and the models to wait for.

Built without side effects, so `deploy --dry-run` prints exactly what a real start would do.
"""

from __future__ import annotations

import errno
import re
import shlex
import socket
from dataclasses import dataclass, field
from pathlib import Path

from trtllm_forge.config import ForgeConfig
from trtllm_forge.deploy.discovery import (
    TritonInstall,
    backend_files,
    check_stub_numpy,
    find_tritonserver,
    server_environment,
)
from trtllm_forge.deploy.server_argv import EXIT_TIMEOUT_S as EXIT_TIMEOUT_S  # re-exported: its old home
from trtllm_forge.deploy.server_argv import PORT_NAMES, bind_address, tritonserver_argv
from trtllm_forge.errors import ConfigError, StepError
from trtllm_forge.stage_results import RenderResult

WILDCARDS = {"0.0.0.0", "::", "", "[::]"}


@dataclass
class LaunchPlan:
    argv: list[str]
    env: dict[str, str]  # changes on top of the caller's environment
    install: TritonInstall
    backend_dir: Path | None  # <wd>/deploy/backends, assembled at start (wheel installs only)
    backend_files: dict[str, str] = field(default_factory=dict)  # dest -> source
    repository: Path = Path()
    models: list[str] = field(default_factory=list)
    ports: dict[str, int] = field(default_factory=dict)
    bind_address: str = "127.0.0.1"
    host: str = "127.0.0.1"
    log: Path = Path()
    world_size: int = 1

    def describe(self) -> dict:
        return {
            "argv": self.argv,
            "command": shlex.join(self.argv),
            "env": self.env,
            "tritonserver": {"kind": self.install.kind, "binary": str(self.install.binary)},
            "backend_directory": str(self.backend_dir) if self.backend_dir else None,
            "files": {
                **self.backend_files,
                str(self.log): "(server log)",
            },
            "repository": str(self.repository),
            "models": self.models,
            "ports": self.ports,
            "bind_address": self.bind_address,
            "world_size": self.world_size,
        }


def connect_host(bind_address: str) -> str:
    return "127.0.0.1" if bind_address in WILDCARDS else bind_address


def _family(address: str) -> int:
    return socket.AF_INET6 if ":" in address else socket.AF_INET


def port_in_use(address: str, port: int) -> bool:
    with socket.socket(_family(address), socket.SOCK_STREAM) as sock:
        # Servers set SO_REUSEADDR, so a port in TIME_WAIT is free for them: test the same way.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((address.strip("[]"), port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return True
            raise
    return False


def free_port(address: str, taken: set[int]) -> int:
    for _ in range(50):
        with socket.socket(_family(address), socket.SOCK_STREAM) as sock:
            sock.bind((address.strip("[]"), 0))
            port = sock.getsockname()[1]
        if port not in taken:
            return port
    raise StepError("triton ports", "could not find a free port", "set triton.http_port/grpc_port/metrics_port explicitly")


def resolve_ports(config: ForgeConfig) -> dict[str, int]:
    """Configured ports, with 0 replaced by a free port; a configured port already in use is an error."""
    address = config.triton.bind_address or "0.0.0.0"
    wanted = {name: getattr(config.triton, f"{name}_port") for name in PORT_NAMES}
    fixed = [p for p in wanted.values() if p]
    if len(set(fixed)) != len(fixed):
        raise ConfigError("triton ports", f"http/grpc/metrics ports must differ, got {wanted}", "use three distinct ports or 0")
    ports: dict[str, int] = {}
    for name, port in wanted.items():
        if port and port_in_use(address, port):
            raise StepError(
                f"triton.{name}_port",
                f"port {port} on {address} is already in use",
                f"stop whatever listens there (`trtllm-forge deploy stop`?) or set triton.{name}_port: 0 to pick a free one",
            )
    taken = set(fixed)
    for name, port in wanted.items():
        if not port:
            port = free_port(address, taken)
            taken.add(port)
        ports[name] = port
    return ports


def repository_models(repository: Path) -> list[str]:
    """Model names Triton will load from the repository (every folder with a config.pbtxt)."""
    if not repository.is_dir():
        raise ConfigError(
            "--repository",
            f"model repository {repository} does not exist",
            "run `trtllm-forge render CONFIG` first or pass --repository DIR",
        )
    models = sorted(p.name for p in repository.iterdir() if p.is_dir() and (p / "config.pbtxt").is_file())
    if not models:
        raise ConfigError("--repository", f"{repository} holds no model (no */config.pbtxt)", "point it at a Triton model repository")
    return models


_ENV_PATH_RE = re.compile(r'key:\s*"EXECUTION_ENV_PATH"\s*value:\s*\{\s*string_value:\s*"([^"]*)"')


def check_stub_env_paths(repository: Path, models: list[str], install: TritonInstall) -> None:
    """Refuse models whose EXECUTION_ENV_PATH hands the wheel's stub NumPy 2: their string tensors would arrive
    corrupted and numeric outputs empty, so the server would load and then fail on the first request."""
    if install.kind != "pytriton":
        return
    for name in models:
        for env_path in _ENV_PATH_RE.findall((repository / name / "config.pbtxt").read_text(errors="replace")):
            if any(Path(env_path).glob("lib/python*/site-packages/numpy-2*.dist-info")):
                raise ConfigError(
                    f"{repository / name / 'config.pbtxt'}",
                    f"EXECUTION_ENV_PATH={env_path} gives the nvidia-pytriton python stub NumPy 2, with which it corrupts string tensors",
                    "point it at an environment with numpy<2, such as trtllm-forge's own",
                )


def default_repository(workdir: Path) -> Path:
    rendered = RenderResult.in_workdir(workdir)
    return rendered.repository if rendered else workdir / "render" / "model_repository"


def rendered_leader_command(workdir: Path, world_size: int) -> list[str]:
    rendered = RenderResult.in_workdir(workdir)
    command = rendered.launch_command if rendered else []
    if not command:
        raise ConfigError(
            "parallel",
            f"world size {world_size} needs the MPI leader-mode command that `trtllm-forge render` writes "
            f"(launch_command in {workdir / 'render' / 'manifest.json'}), and none is there",
            "run `trtllm-forge render CONFIG` first",
        )
    return command


def container_leader_command(config: ForgeConfig, repository: Path, ports: dict[str, int]) -> list[str]:
    """The MPI leader-mode argv inside a container or pod (docker, Kubernetes): the image's tritonserver on every
    rank, rank 0 listening on every interface (the published ports, the probes and the Service reach it there),
    ranks > 0 loading only the engine models. Not the rendered local command, which binds triton.bind_address."""
    from trtllm_forge.render.draft import drafts
    from trtllm_forge.render.launch import plan_launch as plan_rendered_launch
    from trtllm_forge.render.values import choose_kind

    in_container = config.model_copy(update={"deploy": config.deploy.model_copy(update={"target": "kubernetes"})})
    names = config.triton.model_names
    engine_models = (names.tensorrt_llm,) + ((names.tensorrt_llm_draft,) if drafts(config, choose_kind(config, None)) else ())
    plan = plan_rendered_launch(
        in_container,
        repository,
        world_size=config.parallel.world_size,
        engine_models=engine_models,
        ports=(ports["http"], ports["grpc"], ports["metrics"]),
    )
    return plan.argv


def plan_launch(config: ForgeConfig, workdir: Path, repository: Path | None = None) -> LaunchPlan:
    repository = (repository or default_repository(workdir)).resolve()
    models = repository_models(repository)
    install = find_tritonserver()
    files = backend_files(install)
    backend_dir = workdir / "deploy" / "backends" if files else None
    bind = bind_address(config, in_container=False)
    world_size = config.parallel.world_size
    if world_size > 1:
        argv = rendered_leader_command(workdir, world_size)
        ports = {name: getattr(config.triton, f"{name}_port") for name in PORT_NAMES}
        if 0 in ports.values():
            raise ConfigError(
                "triton ports",
                "port 0 (pick a free port) cannot be used with world size > 1: the rendered MPI command fixes the ports",
                "set triton.http_port/grpc_port/metrics_port",
            )
    else:
        ports = resolve_ports(config)
        argv = tritonserver_argv(install.binary, repository, ports, bind, backend_dir=backend_dir)
    env = server_environment(install)
    check_stub_numpy(install)
    check_stub_env_paths(repository, models, install)
    libraries = [str(config.resolve_path(p)) for p in config.engine.plugins.custom_libraries]
    if libraries and config.engine.backend == "tensorrt-llm":
        env["LD_PRELOAD"] = ":".join(libraries)
    return LaunchPlan(
        argv=argv,
        env=env,
        install=install,
        backend_dir=backend_dir,
        backend_files={str(backend_dir / "python" / name): str(src) for name, src in files.items()} if backend_dir else {},
        repository=repository,
        models=models,
        ports=ports,
        bind_address=bind,
        host=connect_host(bind),
        log=workdir / "logs" / "tritonserver.log",
        world_size=world_size,
    )
