"""deploy.server `trtllm-serve`: TensorRT-LLM's OpenAI-compatible server on the llmapi build (on CPU the LLM-API
stand-in's server behind the same argv). The work is done by `deploy/trtllm_serve.py` (command, renderings, local
process); this module puts it behind the kind contract. State: `<workdir>/deploy/trtllm-serve.json`."""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtllm_forge.deploy.kinds.protocol import (
    Deployment,
    DeploymentStatus,
    LocalPlan,
    OpenAIKind,
    ProcessStatus,
    Rendering,
    Speaks,
    refuse_unserved_bench_targets,
)
from trtllm_forge.errors import ConfigError

if TYPE_CHECKING:
    from trtllm_forge.config.schema import ForgeConfig

NAME = "trtllm-serve"


@dataclass
class TrtllmServeDeployment:
    """A local trtllm-serve (or its CPU stand-in) as smoke, verify and bench use it: its OpenAI endpoint."""

    url: str
    model: str  # the /v1/models id: trtllm-serve names the model by the path it was given
    pid: int
    log: str
    argv: list[str]
    stand_in: bool
    running: bool = True

    @property
    def speaks(self) -> Speaks:
        return Speaks.OPENAI

    @property
    def http_url(self) -> str:
        return self.url

    @property
    def where(self) -> str:
        return f"pid {self.pid}"

    @property
    def grpc_url(self) -> str:
        return f"none ({NAME} speaks OpenAI over HTTP)"

    @property
    def metrics_url(self) -> str | None:
        return None  # its /metrics is a JSON list, not Prometheus text

    @property
    def served_model(self) -> str | None:
        return self.model

    def to_dict(self) -> dict[str, Any]:
        return {"server": NAME, **asdict(self), "http_url": self.url}

    @classmethod
    def from_record(cls, record: dict[str, Any], *, running: bool) -> TrtllmServeDeployment:
        from trtllm_forge.deploy.trtllm_serve import model_of

        argv = [str(a) for a in record["argv"]]
        return cls(str(record["url"]), model_of(argv), int(record["pid"]), str(record["log"]), argv, bool(record["stand_in"]), running)


def _serve(deployment: Deployment) -> TrtllmServeDeployment:
    if not isinstance(deployment, TrtllmServeDeployment):
        raise TypeError(f"the {NAME} kind was handed a {type(deployment).__name__}")
    return deployment


def trtllm_serve_needs_llmapi(config: ForgeConfig) -> Iterator[ConfigError]:
    if config.engine.target != "llmapi":
        yield ConfigError("deploy.server", f"{NAME} serves the LLM API, not trtllm-build engines", "set engine.target: llmapi")


def trtllm_serve_bench_is_openai(config: ForgeConfig) -> Iterator[ConfigError]:
    yield from refuse_unserved_bench_targets(config, KIND)


class TrtllmServeKind(OpenAIKind):
    name = NAME  # its entry in trtllm_forge/server_kinds.py SERVER_KINDS (with these config rules)

    def render(self, config: ForgeConfig, workdir: Path, repository: Path, target: str) -> Rendering:
        from trtllm_forge.deploy.trtllm_serve import rendering

        path, text = rendering(config, workdir, target)
        if config.parallel.nodes > 1 and not config.deploy.image:
            from trtllm_forge.builders.tensorrt_llm.container import llmapi_leader_build_argv
            from trtllm_forge.deploy.trtllm_serve import served_llmapi_version

            build = shlex.join(llmapi_leader_build_argv(served_llmapi_version(config)))
            note = f"rendered only; its image adds kubectl (the multi-node leader) to NVIDIA's release image: {build}"
            return Rendering(path, text, executable=target == "docker", note=note)
        return Rendering(path, text, executable=target == "docker")

    def plan_local(self, config: ForgeConfig, workdir: Path, repository: Path) -> LocalPlan:
        from trtllm_forge.deploy.trtllm_serve import LOG, STATE, is_stand_in, local_command

        argv, url = local_command(config, workdir)
        stand_in = is_stand_in(config)
        return LocalPlan(
            document={"server": NAME, "argv": argv, "url": url, "stand_in": stand_in, "dry_run": True},
            sections=[
                ("would run" + (" (the CPU stand-in, not TensorRT-LLM)" if stand_in else "") + ":", [shlex.join(argv)]),
                ("files:", [f"{workdir / 'logs' / LOG} (server log)", f"{workdir / 'deploy' / STATE} (deployment state)"]),
                (f"serves OpenAI's API on {url}", []),
            ],
        )

    def start(self, config: ForgeConfig, workdir: Path, repository: Path, *, ready_timeout_s: float | None = None) -> Deployment:
        from trtllm_forge.deploy.trtllm_serve import start_recorded

        return TrtllmServeDeployment.from_record(start_recorded(config, workdir, ready_timeout_s), running=True)

    @contextmanager
    def serving(self, config: ForgeConfig, workdir: Path, repository: Path, *, keep: bool = False) -> Iterator[Deployment]:
        from trtllm_forge.deploy.trtllm_serve import refuse_running, start_recorded, stop

        refuse_running(workdir)  # before the try: a server that was running already is not ours to stop
        try:  # from before the start: a SIGTERM between "ready" and the body must still stop the server
            yield TrtllmServeDeployment.from_record(start_recorded(config, workdir, die_with_caller=not keep), running=True)
        finally:
            if not keep:
                stop(workdir)

    def read(self, workdir: Path) -> Deployment | None:
        from trtllm_forge.deploy.trtllm_serve import is_healthy, is_running, recorded

        record = recorded(workdir)
        if record is None:
            return None
        return TrtllmServeDeployment.from_record(record, running=is_running(record) and is_healthy(str(record["url"])))

    def health(self, deployment: Deployment) -> list[str]:
        from trtllm_forge.deploy.trtllm_serve import is_healthy

        serve = _serve(deployment)
        return [] if is_healthy(serve.url) else [f"{NAME} (pid {serve.pid}) does not answer {serve.url}/health"]

    def status(self, deployment: Deployment) -> DeploymentStatus:
        from trtllm_forge.deploy.trtllm_serve import is_running

        serve = _serve(deployment)
        alive = is_running({"pid": serve.pid, "argv": serve.argv})
        problems = self.health(serve) if alive else []
        serve.running = alive and not problems
        process = ProcessStatus(NAME, serve.pid, alive, serve.running, serve.log)
        return DeploymentStatus(
            server=self.name, deployment=serve, processes=[process], endpoints={serve.model: serve.running}, problems=problems
        )

    def stop(self, workdir: Path, *, grace_s: float) -> Deployment | None:
        from trtllm_forge.deploy.trtllm_serve import stop

        record = stop(workdir, grace_s)
        return None if record is None else TrtllmServeDeployment.from_record(record, running=False)


KIND = TrtllmServeKind()
