"""Which serving image carries which TensorRT-LLM, TensorRT, CUDA, minimum driver, Python and torch
(spec/serving-images.json: every trtllm-python-py3 row of NVIDIA's Triton compatibility matrix), and the checks
built on it: an engine only loads in an image with the TensorRT-LLM that built it, and an image only starts on a
driver at least as new as its minimum.

The JSON is the one definition; every row names its source. An engine's TensorRT-LLM version comes from its
config.json (`version`, written by trtllm-build). A version is served by the newest NGC image that ships it; our
image (docker/Dockerfile on that NGC image: trtllm-forge for `build-engine`, the release's example scripts, kubectl
for the multi-node launcher) builds the engines and leads multi-node pods. Only a version no NGC image ships goes
through a route (docker/Dockerfile installing the pinned wheel on the route's base image).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from dataclasses import dataclass, replace
from functools import lru_cache
from importlib import resources
from typing import TYPE_CHECKING, Any

from trtllm_forge.builders.tensorrt_llm.engine import ENGINE

from trtllm_forge import __version__
from trtllm_forge.errors import ConfigError

if TYPE_CHECKING:
    from trtllm_forge.config.schema import ForgeConfig

# What plan, doctor and build-engine say about the engine path (one sentence, defined once).
LEGACY_ENGINE_PATH = (
    "the engine path (engine.target: engine) is the legacy TensorRT-LLM 1.2.x line: NVIDIA removed TensorRT engines "
    "in TensorRT-LLM 1.3 (deprecation TensorRT-LLM#11723, removal #15763), so new deployments use engine.target: llmapi"
)

# Our own image: docker/Dockerfile on the version's NGC image (or route base), tagged with the TensorRT-LLM it carries.
FORGE_IMAGE_RE = re.compile(r"^trtllm-forge:[^-\s]+-trtllm(?P<version>\d[\w.]*)$")


@dataclass(frozen=True)
class ServingImage:
    image: str
    tensorrt_llm: str
    tensorrt: str
    cuda: str
    min_driver: str
    # "ngc" (NVIDIA ships it) | "forge-on-ngc" (docker/Dockerfile on that NGC image, its TensorRT-LLM untouched)
    # | "pinned-install" (a route: docker/Dockerfile installs the pinned wheel on base_image)
    how: str
    base_image: str | None
    sources: tuple[str, ...]
    python: str | None = None
    torch: str | None = None
    triton: str | None = None  # the Triton release of an NGC row


# How NVIDIA's TensorRT-LLM containers are run (NVIDIA/TensorRT-LLM@20c5f48b:docs/source/installation/containers.md:
# `--ipc=host --ulimit memlock=-1 --ulimit stack=67108864`; without --ipc=host, "Bus error"), for every `docker run`
# we write of one.
GPU_CONTAINER_FLAGS = ("--ipc", "host", "--ulimit", "memlock=-1", "--ulimit", "stack=67108864")


@lru_cache(maxsize=1)
def matrix() -> dict[str, Any]:
    path = resources.files("trtllm_forge.builders.tensorrt_llm").joinpath("spec/serving-images.json")
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def forge_image_tag(trtllm_version: str) -> str:
    return f"trtllm-forge:{__version__}-trtllm{trtllm_version}"


def _release_key(row: ServingImage) -> tuple[int, ...]:
    return _as_tuple(row.triton or "0")


def ngc_images() -> list[ServingImage]:
    """Every NGC row, newest Triton release first."""
    rows = [
        ServingImage(
            r["image"],
            r["tensorrt_llm"],
            r["tensorrt"],
            r["cuda"],
            r["min_driver"],
            "ngc",
            None,
            (r["source"],),
            python=r.get("python"),
            torch=r.get("torch"),
            triton=r.get("triton"),
        )
        for r in matrix()["images"]
    ]
    return sorted(rows, key=_release_key, reverse=True)


def _route(trtllm_version: str) -> ServingImage | None:
    route = matrix()["routes"].get(trtllm_version)
    if route is None:
        return None
    sources = route["source"] if isinstance(route["source"], list) else [route["source"]]
    return ServingImage(
        forge_image_tag(trtllm_version),
        route["tensorrt_llm"],
        route["tensorrt"],
        route["cuda"],
        route["min_driver"],
        "pinned-install",
        route["base_image"],
        tuple(sources),
    )


def known_versions() -> list[str]:
    return sorted({r.tensorrt_llm for r in ngc_images()} | set(matrix()["routes"]), key=_as_tuple)


def image_for_version(trtllm_version: str) -> ServingImage:
    """The image that serves engines of this TensorRT-LLM version: the newest NGC image that ships it, else the
    documented route (our Dockerfile installing the pinned version on a base image)."""
    for row in ngc_images():
        if row.tensorrt_llm == trtllm_version:
            return row
    route = _route(trtllm_version)
    if route is None:
        raise ConfigError(
            "engine.trtllm_version",
            f"no serving image is known for TensorRT-LLM {trtllm_version}",
            f"one of {', '.join(known_versions())} (builders/tensorrt_llm/spec/serving-images.json)",
        )
    return route


def build_image_for_version(trtllm_version: str) -> ServingImage:
    """Our image for this version: docker/Dockerfile on the serving image (trtllm-forge, the release's example
    scripts, kubectl), carrying the same TensorRT-LLM and TensorRT, so its engines load in either."""
    row = image_for_version(trtllm_version)
    if row.how == "pinned-install":
        return row
    return replace(row, image=forge_image_tag(trtllm_version), how="forge-on-ngc", base_image=row.image)


def serving_image(deploy_image: str | None, trtllm_version: str, multi_node: bool = False) -> str:
    """deploy.image when set, else the image that serves this TensorRT-LLM version; a multi-node (LeaderWorkerSet)
    deployment needs our image, whose kubectl starts the ranks in the worker pods."""
    if deploy_image:
        return deploy_image
    return (build_image_for_version if multi_node else image_for_version)(trtllm_version).image


@dataclass(frozen=True)
class ReleaseImage:
    """NVIDIA's TensorRT-LLM release image of one LLM-API version and the ModelOpt line it installs."""

    version: str
    image: str
    modelopt: str  # the nvidia-modelopt requirement of that TensorRT-LLM (e.g. "~=0.37.0")
    modelopt_uncertain: bool  # not read from that version's own requirements.txt
    sources: tuple[str, ...]


def release_image(llmapi_version: str) -> ReleaseImage:
    """The TensorRT-LLM release image of an LLM-API version (spec/serving-images.json `release_images`): where the
    ModelOpt quantization step of the LLM-API path runs."""
    rows = matrix()["release_images"]
    row = rows.get(llmapi_version)
    if not isinstance(row, dict):
        known = ", ".join(key for key, value in rows.items() if isinstance(value, dict))
        raise ConfigError("engine.llmapi_version", f"no TensorRT-LLM release image is known for {llmapi_version}", f"one of {known}")
    return ReleaseImage(llmapi_version, row["image"], row["modelopt"], bool(row["modelopt_uncertain"]), tuple(row["source"]))


def llmapi_serving_image(deploy_image: str | None, llmapi_version: str, multi_node: bool = False) -> str:
    """deploy.image when set, else NVIDIA's TensorRT-LLM release image of the LLM-API version (it carries
    `trtllm-serve` and exactly that version's LLM API, so the rendered flags are the ones it parses); a multi-node
    (LeaderWorkerSet) deployment needs kubectl in the leader: our docker/Dockerfile on that release image."""
    if deploy_image:
        return deploy_image
    return forge_image_tag(llmapi_version) if multi_node else release_image(llmapi_version).image


def check_engine_for_config(config: ForgeConfig, engine_version: str) -> None:
    """render/deploy: refuse a TensorRT-LLM engine whose version differs from the serving image's."""
    if config.engine.backend == ENGINE.backend:
        check_engine_image(engine_version, serving_image(config.deploy.image, config.engine.trtllm_version))


def describe_image(image: str) -> ServingImage | None:
    """What the table knows about an image name; None for an image it does not list."""
    for row in ngc_images():
        if row.image == image:
            return row
    match = FORGE_IMAGE_RE.match(image)
    if match and match.group("version") in known_versions():
        return build_image_for_version(match.group("version"))
    return None


def version_mismatch(engine_version: str, image: str) -> str | None:
    """What is wrong when the engine cannot load in this image (None when it can, or when the table does not list the image)."""
    known = describe_image(image)
    if known is None or known.tensorrt_llm == engine_version:
        return None
    return (
        f"the engine was built by TensorRT-LLM {engine_version} but {image} ships TensorRT-LLM {known.tensorrt_llm}, "
        "and engines load only with the version that built them"
    )


def check_engine_image(engine_version: str, image: str, field: str = "deploy.image") -> None:
    """ConfigError (exit 2, one line naming both versions and the image to use) on a mismatch."""
    problem = version_mismatch(engine_version, image)
    if problem:
        try:
            use = image_for_version(engine_version).image
        except ConfigError:
            use = f"an image that ships TensorRT-LLM {engine_version}"
        raise ConfigError(field, problem, f"serve it with {use} (deploy.image), or rebuild the engine in {image}")


# --- driver ---------------------------------------------------------------------------------------------------

_SMI_HEADER_RE = re.compile(r"Driver Version\s*:\s*(\d+(?:\.\d+)+)")
_VERSION_RE = re.compile(r"^\s*(\d+(?:\.\d+)+)\s*$")


def parse_driver_version(smi_output: str) -> str | None:
    """The driver version in `nvidia-smi` output: the default table ("Driver Version: 580.95.05"), `nvidia-smi -q`
    ("Driver Version : 580.95.05") or `--query-gpu=driver_version --format=csv[,noheader]` (one version per GPU
    line); None when absent."""
    match = _SMI_HEADER_RE.search(smi_output)
    if match:
        return match.group(1)
    for line in smi_output.splitlines():
        match = _VERSION_RE.match(line)
        if match:
            return match.group(1)
    return None


def _as_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version))


def driver_problem(driver: str, image: ServingImage) -> str | None:
    if _as_tuple(driver) >= _as_tuple(image.min_driver):
        return None
    return (
        f"NVIDIA driver {driver} is older than {image.min_driver}, the minimum for {image.image} "
        f"(CUDA {image.cuda}); upgrade the driver or use an image built for an older CUDA"
    )


def host_driver_version() -> str | None:
    """The driver here, read with nvidia-smi; None where there is no nvidia-smi (or it fails)."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    try:
        out = subprocess.run(
            [smi, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True, text=True, timeout=20, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_driver_version(out.stdout) if out.returncode == 0 else None


def check_host_driver(image: ServingImage, field: str = "hardware.gpu") -> str | None:
    """ConfigError when nvidia-smi reports a driver older than the image's minimum; returns the driver seen."""
    driver = host_driver_version()
    if driver is None:
        return None
    problem = driver_problem(driver, image)
    if problem:
        raise ConfigError(field, problem, f"a driver >= {image.min_driver}")
    return driver
