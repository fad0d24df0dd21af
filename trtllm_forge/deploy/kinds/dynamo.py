"""deploy.server `dynamo`: NVIDIA Dynamo, an OpenAI frontend with a router in front of N workers. Here, on CPU: the
frontend and workers serving our OpenVINO engine (deploy/dynamo_local.py, deploy/dynamo_worker.py); for GPU
clusters a DynamoGraphDeployment (deploy/dynamo_graph.py, `deploy --target kubernetes`). State:
`<workdir>/deploy/dynamo.json`, discovery files in `<workdir>/deploy/dynamo-discovery`."""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
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
    from trtllm_forge.deploy.dynamo_local import DynamoPlan

NAME = "dynamo"


@dataclass
class DynamoDeployment:
    """A local Dynamo deployment as smoke, verify and bench use it: the frontend's OpenAI endpoint."""

    plan: DynamoPlan
    running: bool = True

    @property
    def speaks(self) -> Speaks:
        return Speaks.OPENAI

    @property
    def pid(self) -> int | None:
        return self.plan.frontend.pid

    @property
    def log(self) -> str:
        return self.plan.frontend.log

    @property
    def where(self) -> str:
        return f"frontend pid {self.pid}"

    @property
    def http_url(self) -> str:
        return self.plan.frontend.url

    @property
    def grpc_url(self) -> str:
        return f"none ({NAME} speaks OpenAI over HTTP)"

    @property
    def metrics_url(self) -> str | None:
        return f"{self.plan.frontend.url}/metrics"

    @property
    def served_model(self) -> str | None:
        return self.plan.model

    def to_dict(self) -> dict[str, Any]:
        return {"server": NAME, "http_url": self.http_url, "model": self.plan.model, "running": self.running, **self.plan.to_dict()}


def _dynamo(deployment: Deployment) -> DynamoDeployment:
    if not isinstance(deployment, DynamoDeployment):
        raise TypeError(f"the {NAME} kind was handed a {type(deployment).__name__}")
    return deployment


def dynamo_bench_is_openai(config: ForgeConfig) -> Iterator[ConfigError]:
    yield from refuse_unserved_bench_targets(config, KIND)


class DynamoKind(OpenAIKind):
    name = NAME  # its entry in trtllm_forge/server_kinds.py SERVER_KINDS (with these config rules)

    def render(self, config: ForgeConfig, workdir: Path, repository: Path, target: str) -> Rendering:
        """kubernetes: a DynamoGraphDeployment; docker: the same graph on one GPU host, as a launch script to run in
        NVIDIA's Dynamo TensorRT-LLM runtime image. Rendered and checked here, never run."""
        from trtllm_forge.deploy.dynamo_graph import render_dynamo_graph, render_dynamo_launch_script

        if target == "kubernetes":
            path, text = render_dynamo_graph(config, workdir)
            return Rendering(Path(path), text, note="rendered only: a DynamoGraphDeployment for NVIDIA Dynamo's operator")
        if target == "docker":
            path, text = render_dynamo_launch_script(config, workdir)
            return Rendering(
                Path(path), text, executable=True, note="rendered only: run it on one GPU host in NVIDIA's Dynamo TensorRT-LLM image"
            )
        raise ConfigError("deploy.target", f"{NAME} renders for kubernetes or docker, not {target}", "use --target kubernetes or docker")

    def plan_local(self, config: ForgeConfig, workdir: Path, repository: Path) -> LocalPlan:
        from trtllm_forge.deploy.dynamo_local import STATE, plan, router_knowledge

        deployment = plan(config, workdir)
        lines = []
        for process in deployment.processes:
            env = " ".join(f"{k}={shlex.quote(v)}" for k, v in process.env.items())
            lines.append(f"{env} {shlex.join(process.argv)}")
        return LocalPlan(
            document={"server": NAME, **deployment.to_dict(), "dry_run": True},
            sections=[
                (
                    f"would run (a frontend, router {config.deploy.dynamo.router_mode} knowing the caches by "
                    f"{router_knowledge(config)}, and {len(deployment.workers)} workers):",
                    lines,
                ),
                (
                    "files:",
                    [p.log for p in deployment.processes]
                    + [f"{workdir / 'deploy' / STATE} (deployment state)", f"{deployment.discovery_dir} (discovery)"],
                ),
                (f"serves OpenAI's API on {deployment.frontend.url}", []),
            ],
        )

    def start(self, config: ForgeConfig, workdir: Path, repository: Path, *, ready_timeout_s: float | None = None) -> Deployment:
        from trtllm_forge.deploy.dynamo_local import start

        return DynamoDeployment(start(config, workdir, ready_timeout_s))

    @contextmanager
    def serving(self, config: ForgeConfig, workdir: Path, repository: Path, *, keep: bool = False) -> Iterator[Deployment]:
        from trtllm_forge.deploy.dynamo_local import recorded, start, stop
        from trtllm_forge.errors import StepError

        previous = recorded(workdir)
        if previous is not None and any(p.alive() for p in previous.processes):
            raise StepError(
                "deploy",
                f"a dynamo deployment from this workdir is running ({previous.frontend.url})",
                f"stop it first: `trtllm-forge deploy stop --workdir {workdir}`",
            )
        try:  # from before the start: a SIGTERM between "ready" and the body must still stop it
            yield DynamoDeployment(start(config, workdir, die_with_caller=not keep))
        finally:
            if not keep:
                stop(workdir)

    def read(self, workdir: Path) -> Deployment | None:
        from trtllm_forge.deploy.dynamo_local import recorded

        deployment = recorded(workdir)
        if deployment is None:
            return None
        return DynamoDeployment(deployment, running=deployment.frontend.alive() and deployment.frontend.ready())

    def health(self, deployment: Deployment) -> list[str]:
        return self.status(deployment).problems

    def status(self, deployment: Deployment) -> DeploymentStatus:
        dynamo = _dynamo(deployment)
        processes, problems = [], []
        for process in dynamo.plan.processes:
            alive = process.alive()
            ready = alive and process.ready()
            processes.append(ProcessStatus(process.role, process.pid, alive, ready, process.log))
            if not alive:
                problems.append(f"{process.role} (pid {process.pid}) is dead; see {process.log}")
            elif not ready:
                problems.append(f"{process.role} (pid {process.pid}) is not ready at {process.url}")
        frontend = processes[0]
        dynamo.running = frontend.alive and frontend.ready
        leftovers = [p.pid for p in processes if p.alive] if not frontend.alive else []
        status = DeploymentStatus(
            server=self.name,
            deployment=dynamo,
            processes=processes,
            endpoints={dynamo.plan.model: dynamo.running},
            problems=problems,
            leftover_pids=[pid for pid in leftovers if pid is not None],
        )
        if frontend.alive:  # `deploy` starts only the dead workers again; the frontend and the others keep serving
            status.restart = "`trtllm-forge deploy` (it starts the dead workers again; the frontend and the live workers keep serving)"
        return status

    def stop(self, workdir: Path, *, grace_s: float) -> Deployment | None:
        from trtllm_forge.deploy.dynamo_local import stop

        deployment = stop(workdir, grace_s)
        return None if deployment is None else DynamoDeployment(deployment, running=False)


KIND = DynamoKind()
