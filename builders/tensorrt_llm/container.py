"""Where the GPU build runs: detection of TensorRT-LLM and a GPU here, and the `docker run` command that
runs the same build inside the pinned NGC TensorRT-LLM container otherwise."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from trtllm_forge.builders.tensorrt_llm.images import GPU_CONTAINER_FLAGS, forge_image_tag, release_image

from trtllm_forge.config.schema import ForgeConfig

DOCKERFILE = "docker/Dockerfile"


@dataclass(frozen=True)
class Runtime:
    trtllm_version: str | None  # installed tensorrt_llm version, None when absent
    gpus: list[str]  # `nvidia-smi -L` names

    def missing(self, wanted: str, compatible: list[str]) -> str | None:
        problems = []
        if self.trtllm_version is None:
            problems.append(f"TensorRT-LLM {wanted} is not installed (no tensorrt_llm module)")
        elif self.trtllm_version not in compatible:
            problems.append(f"TensorRT-LLM {self.trtllm_version} is installed but the builder is pinned to {wanted}")
        if not self.gpus:
            problems.append("no NVIDIA GPU is visible (nvidia-smi -L lists none)")
        return " and ".join(problems) or None


def trtllm_version() -> str | None:
    """Installed tensorrt_llm version, read from package metadata: importing it would initialise CUDA."""
    if importlib.util.find_spec("tensorrt_llm") is None:
        return None
    for dist in ("tensorrt-llm", "tensorrt_llm"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "unknown"


def visible_gpus() -> list[str]:
    smi = shutil.which("nvidia-smi")
    if not smi:
        return []
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.strip() for line in out.stdout.splitlines() if line.startswith("GPU ")]


def probe() -> Runtime:
    return Runtime(trtllm_version(), visible_gpus())


def image_tag(trtllm_version: str) -> str:
    """Our serving/build image (docker/Dockerfile on the route's NGC base image, spec/serving-images.json)."""
    return forge_image_tag(trtllm_version)


def docker_build_argv(base_image: str, trtllm_version: str) -> list[str]:
    return [
        "docker",
        "build",
        "-f",
        DOCKERFILE,
        "--build-arg",
        f"BASE_IMAGE={base_image}",
        "--build-arg",
        f"TRTLLM_VERSION={trtllm_version}",
        "-t",
        image_tag(trtllm_version),
        ".",
    ]


def build_gpus(config: ForgeConfig) -> int:
    """GPUs the build uses on its one node: trtllm-build builds every rank's engine, one rank per GPU at a time
    (--workers), so a multi-node engine (tp x pp > gpus_per_node) is built on one node and its ranks are served from
    storage every node reads."""
    return min(config.parallel.world_size, config.parallel.gpus_per_node)


def docker_run_argv(
    config: ForgeConfig,
    config_file: Path | None,
    workdir: Path,
    host_paths: list[str],
    trtllm_version: str,
    extra_args: list[str] | None = None,
) -> list[str]:
    """`docker run` of `trtllm-forge build-engine CONFIG_FILE` in the container on ONE node, every path mounted at
    the same place; `config_file` is the file the config was loaded from (None: a config built in memory)."""
    gpus = build_gpus(config)
    argv = [
        "docker",
        "run",
        "--rm",
        "--gpus",
        str(gpus),
        *GPU_CONTAINER_FLAGS,
        "--shm-size",
        "1g",
        "-e",
        "HF_HUB_OFFLINE=1",
        "-e",
        "HF_DATASETS_OFFLINE=1",
    ]
    mounts: list[tuple[str, str]] = []
    for path in host_paths:
        if path and path not in {m[0] for m in mounts}:
            mounts.append((path, "ro"))
    mounts.append((str(workdir), "rw"))
    for path, mode in mounts:
        argv += ["-v", f"{path}:{path}:{mode}"]
    argv += ["-w", str(workdir), image_tag(trtllm_version), "trtllm-forge", "build-engine"]
    argv += [str(config_file)] if config_file else ["CONFIG"]
    argv += ["--workdir", str(workdir), *(extra_args or [])]
    return argv


def llmapi_leader_build_argv(llmapi_version: str) -> list[str]:
    """The `docker build` of a multi-node LLM-API leader image (images.llmapi_serving_image with multi_node): our
    docker/Dockerfile on NVIDIA's TensorRT-LLM release image of that version, for kubectl."""
    return docker_build_argv(release_image(llmapi_version).image, llmapi_version)
