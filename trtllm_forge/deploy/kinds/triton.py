"""deploy.server `triton`: tritonserver on the rendered model repository. The work is done by `deploy/server.py`
(start, wait, stop, status), its runners (`deploy/runner.py`: where the server runs, a process group here or, for
deploy.target docker and a CPU engine, a container of the CPU image) and `deploy/targets.py` (the docker/Kubernetes
renderings `deploy --target` writes for what does not run here); this module puts them behind the kind contract.
State: `<workdir>/deploy/state.json` (`deploy/state.py`)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from trtllm_forge.deploy.kinds.protocol import (
    Deployment,
    DeploymentStatus,
    LocalPlan,
    Rendering,
    Speaks,
)

if TYPE_CHECKING:
    from trtllm_forge.config.schema import ForgeConfig
    from trtllm_forge.deploy.state import TritonDeployment


def _triton(deployment: Deployment) -> TritonDeployment:
    from trtllm_forge.deploy.state import TritonDeployment

    if not isinstance(deployment, TritonDeployment):
        raise TypeError(f"the triton kind was handed a {type(deployment).__name__}")
    return deployment


class TritonKind:
    name = "triton"  # its entry in trtllm_forge/server_kinds.py SERVER_KINDS
    speaks = Speaks.TRITON
    default_bench_target = "triton-grpc"

    def serves_bench_target(self, target: str) -> bool:
        return True  # every bench target: the triton-* ones, and openai against a frontend given with --url

    def render(self, config: ForgeConfig, workdir: Path, repository: Path, target: str) -> Rendering:
        from trtllm_forge.deploy.targets import render_target

        path, text = render_target(config, workdir, repository, target)
        if target != "docker":
            return Rendering(path, text)
        note = f"written, not run: engine.backend {config.engine.backend} serves on a GPU, and a GPU host runs this script"
        return Rendering(path, text, executable=True, note=note)

    def runs(self, config: ForgeConfig) -> bool:
        from trtllm_forge.deploy.runner import runs_here

        return runs_here(config)

    def plan_local(self, config: ForgeConfig, workdir: Path, repository: Path) -> LocalPlan:
        from trtllm_forge.deploy.server import runner_for
        from trtllm_forge.deploy.state import state_path

        runner = runner_for(config)
        plan = runner.plan(config, workdir, repository)
        state = state_path(workdir)
        return LocalPlan(
            document={**plan.describe(), "where": runner.where, "dry_run": True, "state": str(state)},
            sections=runner.dry_run_sections(plan, state),
        )

    def start(self, config: ForgeConfig, workdir: Path, repository: Path, *, ready_timeout_s: float | None = None) -> Deployment:
        from trtllm_forge.deploy.server import start_server

        return start_server(config, workdir, repository, ready_timeout_s=ready_timeout_s)

    @contextmanager
    def serving(self, config: ForgeConfig, workdir: Path, repository: Path, *, keep: bool = False) -> Iterator[Deployment]:
        from trtllm_forge.deploy.server import serving

        with serving(config, workdir, repository, keep=keep) as deployment:
            yield deployment

    def read(self, workdir: Path) -> Deployment | None:
        from trtllm_forge.deploy.server import server_status

        return server_status(workdir)

    def health(self, deployment: Deployment) -> list[str]:
        from trtllm_forge.deploy.server import recorded_runner

        triton = _triton(deployment)
        return recorded_runner(triton).health(triton)

    def status(self, deployment: Deployment) -> DeploymentStatus:
        from trtllm_forge.deploy.server import recorded_runner

        triton = _triton(deployment)
        runner = recorded_runner(triton)
        if triton.running:
            problems = runner.health(triton)
        else:  # why a started, never stopped server no longer runs (a killed container: its exit code)
            ended = None if triton.stopped_at else runner.ended(triton)
            problems = [ended] if ended else []
        return DeploymentStatus(
            server=self.name,
            deployment=triton,
            processes=[runner.process(triton)],
            endpoints=dict(triton.models),
            problems=problems,
            leftover_pids=[] if triton.running else runner.leftovers(triton),
        )

    def stop(self, workdir: Path, *, grace_s: float) -> Deployment | None:
        from trtllm_forge.deploy.server import stop_server

        return stop_server(workdir, grace_s=grace_s, quiet=True)

    def query_examples(self, config: ForgeConfig, deployment: Deployment) -> str:
        from trtllm_forge.entrypoint import entry_model, is_llmapi

        entry = entry_model(config)
        max_tokens = "sampling_param_max_tokens" if is_llmapi(config) else "max_tokens"
        client = (
            "trtllm_forge.llmapi_requests import llmapi_generate as generate"
            if is_llmapi(config)
            else "trtllm_forge.client import generate"
        )
        return (
            "query it with curl:\n"
            f"  curl -s -X POST {deployment.http_url}/v2/models/{entry}/generate "
            '-d \'{"text_input": "The capital of France is", "' + max_tokens + "\": 20}'\n"
            "or with a few lines of tritonclient (streaming over gRPC):\n"
            f"  from {client}\n"
            f'  print(generate("{deployment.grpc_url}", "The capital of France is", 20, stream=True, model="{entry}").text)'
        )


KIND = TritonKind()
