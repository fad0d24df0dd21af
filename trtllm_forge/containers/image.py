"""Build (or reuse) the CPU serving image from docker/Containerfile.cpu, on a local base made with mmdebstrap.

No registry is reachable on the project's machines, so nothing is pulled: the base is a Debian root filesystem made
by `mmdebstrap` and imported, and the Python packages come from a wheelhouse made on the host (`pip download` of the
packages the served models import and of the project's own dependencies, at the host's versions; `pip wheel` of
the source tree), bind-mounted into the build. Both images are tagged by a content hash of what they are made of
(the base: the mmdebstrap command; the image: the base, the Containerfile, the requirements and constraints, the
project's source), so a second call finds them and does nothing.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import trtllm_forge
from trtllm_forge.containers.runtime import INSTALL_HINT, ContainerRuntime, run_logged
from trtllm_forge.errors import StepError
from trtllm_forge.locks import file_lock
from trtllm_forge.package_versions import installed_version
from trtllm_forge.user_cache import user_cache_dir

PROJECT_ROOT = Path(trtllm_forge.__file__).resolve().parent.parent
CONTAINERFILE = PROJECT_ROOT / "docker" / "Containerfile.cpu"
# What the project wheel is built from (pyproject's package-dir and readme): its hash is part of the image key.
PROJECT_SOURCES = ("pyproject.toml", "README.md", "trtllm_forge", "builders", "plugins", "model_repo_templates")
SKIPPED_PARTS = {"__pycache__", ".mypy_cache", ".pytest_cache"}

BASE_SUITE = "bookworm"  # its python3 is 3.11, the Python the wheel's stub and our wheelhouse are built for
BASE_PACKAGES = (
    "python3",
    "python3-venv",
    "ca-certificates",
    "libpython3.11",  # the python backend stub links libpython3.11.so
    "libstdc++6",  # tritonserver, the stub and the python backend
    "zlib1g",
)
BASE_NAME = "localhost/trtllm-forge-base"
IMAGE_NAME = "localhost/trtllm-forge-cpu"
IMAGE_LABEL = "org.trtllm-forge.image"  # = "cpu" on every image built here (for pruning old ones)
KEY_LABEL = "org.trtllm-forge.image-key"

# What the CPU repository's python models import (model_repo_templates/: the engine model, the tokenizer models),
# pinned to the host's versions. nvidia-pytriton (the server) goes in without its dependencies, as `make setup` does.
SERVED_PACKAGES = ("numpy", "tokenizers", "openvino", "openvino-genai", "openvino-tokenizers", "onnxruntime", "onnxruntime-genai")
NO_DEPS_PACKAGES = ("nvidia-pytriton",)
PROJECT_DISTRIBUTION = "trtllm-forge"
BUILD_TIMEOUT_S = 1800.0
LOCK_WAIT_S = 3600.0


@dataclass(frozen=True)
class Wheelhouse:
    """The three requirement files the image installs from its wheelhouse (and whose text is part of the key)."""

    requirements: str
    requirements_no_deps: str
    constraints: str


@dataclass(frozen=True)
class ImagePlan:
    """Everything a build runs, computed without side effects (`dry_run` returns its commands)."""

    tag: str
    base_tag: str
    key: str
    context: Path  # the build context (made on the host, removed after the build)
    wheelhouse: Wheelhouse
    project_digest: str
    containerfile: Path = CONTAINERFILE

    @property
    def base_tar(self) -> Path:
        return self.context.parent / f"base-{self.base_tag.rsplit('-', 1)[-1]}.tar"

    def base_commands(self, runtime: ContainerRuntime) -> list[list[str]]:
        return [mmdebstrap_argv(self.base_tar), runtime.argv("import", str(self.base_tar), self.base_tag)]

    def wheelhouse_commands(self) -> list[list[str]]:
        pip = [sys.executable, "-m", "pip"]
        wheels = str(self.context / "wheelhouse")
        return [
            [
                *pip,
                "download",
                "--quiet",
                "--only-binary=:all:",
                "-d",
                wheels,
                "-r",
                f"{wheels}/requirements.txt",
                "-c",
                f"{wheels}/constraints.txt",
            ],
            [*pip, "download", "--quiet", "--only-binary=:all:", "--no-deps", "-d", wheels, "-r", f"{wheels}/requirements-no-deps.txt"],
            [*pip, "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", str(self.context / "project"), str(PROJECT_ROOT)],
        ]

    def build_command(self, runtime: ContainerRuntime) -> list[str]:
        return runtime.argv(
            "build",
            "--file",
            str(self.containerfile),
            "--build-arg",
            f"BASE_IMAGE={self.base_tag}",
            "--label",
            f"{IMAGE_LABEL}=cpu",
            "--label",
            f"{KEY_LABEL}={self.key}",
            "--tag",
            self.tag,
            str(self.context),
        )

    def commands(self, runtime: ContainerRuntime) -> list[list[str]]:
        """Every command of a build from nothing, in order."""
        return [*self.base_commands(runtime), *self.wheelhouse_commands(), self.build_command(runtime)]


@dataclass
class ImageBuild:
    """What `ensure_image` did: the tags, whether each image was built now (False: reused) and the seconds taken."""

    tag: str
    base_tag: str
    built: bool
    base_built: bool
    seconds: dict[str, float] = field(default_factory=dict)
    commands: list[list[str]] = field(default_factory=list)


def mmdebstrap_argv(tar: Path) -> list[str]:
    return ["mmdebstrap", "--quiet", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}", BASE_SUITE, str(tar)]


def _digest(*parts: str | bytes) -> str:
    sha = hashlib.sha256()
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        sha.update(len(data).to_bytes(8, "little"))
        sha.update(data)
    return sha.hexdigest()


def base_tag() -> str:
    """The base image's tag: the suite and a hash of the mmdebstrap command that makes it."""
    return f"{BASE_NAME}:{BASE_SUITE}-{_digest(*mmdebstrap_argv(Path('rootfs.tar')))[:12]}"


def _source_files(root: Path) -> Iterator[Path]:
    for name in PROJECT_SOURCES:
        path = root / name
        if path.is_file():
            yield path
        elif path.is_dir():
            for file in sorted(path.rglob("*")):
                if file.is_file() and not SKIPPED_PARTS.intersection(file.parts) and file.suffix != ".pyc":
                    yield file


def project_digest(root: Path = PROJECT_ROOT) -> str:
    """sha256 over the project's source files (relative path and content), what the project wheel is built from."""
    sha = hashlib.sha256()
    for file in _source_files(root):
        sha.update(_digest(str(file.relative_to(root)), file.read_bytes()).encode())
    return sha.hexdigest()


def _pinned(name: str) -> str:
    version = installed_version(name)
    if version is None:
        raise StepError(
            "container image", f"{name} is not installed on this host, so its wheel cannot go into the image", "run `make setup`"
        )
    return f"{name}=={version}"


def _core_requirements() -> list[str]:
    """The project's own dependencies (no extras), as pyproject declares them."""
    declared = metadata.requires(PROJECT_DISTRIBUTION) or []
    return [req.split(";")[0].strip() for req in declared if "extra ==" not in req]


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def wheelhouse_requirements() -> Wheelhouse:
    """The image's requirements at this host's versions: what the served models import, the project's own
    dependencies, and every installed distribution's version as a constraint (so transitive ones match too)."""
    requirements = [_pinned(name) for name in SERVED_PACKAGES] + _core_requirements()
    skipped = {_canonical(PROJECT_DISTRIBUTION), *(_canonical(name) for name in NO_DEPS_PACKAGES)}
    installed = {_canonical(dist.metadata["Name"]): dist.version for dist in metadata.distributions() if dist.metadata["Name"]}
    constraints = [f"{name}=={version}" for name, version in sorted(installed.items()) if name not in skipped]
    return Wheelhouse(
        requirements="\n".join(requirements) + "\n",
        requirements_no_deps="\n".join(_pinned(name) for name in NO_DEPS_PACKAGES) + "\n",
        constraints="\n".join(constraints) + "\n",
    )


def _check_sources() -> None:
    for needed in (PROJECT_ROOT / "pyproject.toml", CONTAINERFILE):
        if not needed.is_file():
            raise StepError(
                "container image",
                f"{needed} is missing: the CPU image is built from trtllm-forge's source tree",
                "run from a checkout of trtllm-forge installed with `pip install -e .` (`make setup`)",
            )


def plan_image(context_root: Path | None = None) -> ImagePlan:
    """The image this host's project and packages make, and how (reads files, runs nothing)."""
    _check_sources()
    wheelhouse = wheelhouse_requirements()
    base = base_tag()
    source = project_digest()
    key = _digest(
        base, CONTAINERFILE.read_bytes(), wheelhouse.requirements, wheelhouse.requirements_no_deps, wheelhouse.constraints, source
    )
    root = context_root or user_cache_dir() / "containers" / "build"
    return ImagePlan(
        tag=f"{IMAGE_NAME}:{key[:16]}", base_tag=base, key=key, context=root / key[:16], wheelhouse=wheelhouse, project_digest=source
    )


def cpu_image_tag() -> str:
    """The CPU serving image's tag for this host's project and packages (`localhost/trtllm-forge-cpu:<content hash>`):
    what `make image` builds and what every rendering of a CPU deployment names (deploy/targets.py)."""
    return plan_image().tag


def image_exists(runtime: ContainerRuntime, tag: str, log: Path) -> bool:
    return runtime.run(["image", "inspect", "--format", "{{.Id}}", tag], log, check=False).returncode == 0


def _write_context(plan: ImagePlan) -> None:
    if plan.context.exists():
        shutil.rmtree(plan.context)
    wheels = plan.context / "wheelhouse"
    wheels.mkdir(parents=True)
    (plan.context / "project").mkdir()
    (plan.context / "project" / "source.sha256").write_text(plan.project_digest + "\n")
    (wheels / "requirements.txt").write_text(plan.wheelhouse.requirements)
    (wheels / "requirements-no-deps.txt").write_text(plan.wheelhouse.requirements_no_deps)
    (wheels / "constraints.txt").write_text(plan.wheelhouse.constraints)


def _build_base(runtime: ContainerRuntime, plan: ImagePlan, log: Path) -> None:
    if shutil.which("mmdebstrap") is None:
        raise StepError("container image", "mmdebstrap is not installed (it makes the image's Debian base)", INSTALL_HINT)
    plan.base_tar.parent.mkdir(parents=True, exist_ok=True)
    try:
        mmdebstrap, import_base = plan.base_commands(runtime)
        run_logged(mmdebstrap, log, timeout_s=BUILD_TIMEOUT_S)
        runtime.run(import_base[1:], log)
    finally:
        plan.base_tar.unlink(missing_ok=True)


def prune_old_images(runtime: ContainerRuntime, keep: str, log: Path) -> None:
    """Remove the CPU images of earlier keys (an image a container still uses stays: rmi refuses it)."""
    listed = runtime.run(["images", "--filter", f"label={IMAGE_LABEL}=cpu", "--format", "{{.Repository}}:{{.Tag}}"], log, check=False)
    for tag in sorted(set(listed.stdout.split())):
        if tag != keep and tag.startswith(IMAGE_NAME + ":"):
            runtime.run(["rmi", tag], log, check=False)


def ensure_image(runtime: ContainerRuntime, log: Path, *, dry_run: bool = False, context_root: Path | None = None) -> ImageBuild:
    """The CPU image for this host's project and packages, built when no image of its key exists.
    With `dry_run`, nothing runs: the result lists the commands a build from nothing would run."""
    plan = plan_image(context_root)
    if dry_run:
        return ImageBuild(plan.tag, plan.base_tag, built=False, base_built=False, commands=plan.commands(runtime))

    def busy(holder: int | None) -> StepError:
        return StepError("container image", f"another build of {plan.tag} (pid {holder}) did not finish in time", "wait for it or stop it")

    with file_lock(user_cache_dir() / "containers" / "build.lock", wait_s=LOCK_WAIT_S, busy=busy):
        result = ImageBuild(plan.tag, plan.base_tag, built=False, base_built=False)
        if image_exists(runtime, plan.tag, log):
            return result
        started = time.monotonic()
        if not image_exists(runtime, plan.base_tag, log):
            _build_base(runtime, plan, log)
            result.base_built = True
            result.commands += plan.base_commands(runtime)
            result.seconds["base"] = time.monotonic() - started
        try:
            _write_context(plan)
            step = time.monotonic()
            for argv in plan.wheelhouse_commands():
                run_logged(argv, log, timeout_s=BUILD_TIMEOUT_S)
            result.seconds["wheelhouse"] = time.monotonic() - step
            step = time.monotonic()
            runtime.run(plan.build_command(runtime)[1:], log, timeout_s=BUILD_TIMEOUT_S)
            result.seconds["image"] = time.monotonic() - step
            result.commands += [*plan.wheelhouse_commands(), plan.build_command(runtime)]
        finally:
            shutil.rmtree(plan.context, ignore_errors=True)
        result.built = True
        prune_old_images(runtime, plan.tag, log)
        return result


def main() -> int:
    """`python -m trtllm_forge.containers.image` (make setup): build the CPU image unless it exists; skipped, with the
    command that installs one, when there is no container runtime."""
    import os

    from trtllm_forge.containers.runtime import find_runtime
    from trtllm_forge.errors import ForgeError

    try:
        runtime = find_runtime()
    except StepError as exc:
        print(f"CPU serving image skipped: {exc.format_message()}")
        return 0
    if os.geteuid() != 0:
        print("CPU serving image skipped: its base is made with mmdebstrap as root (run `sudo make setup`)")
        return 0
    log = user_cache_dir() / "containers" / "image.log"
    try:
        build = ensure_image(runtime, log)
    except ForgeError as exc:
        print(f"CPU serving image failed: {exc.format_message()}", file=sys.stderr)
        return 1
    timings = ", ".join(f"{step} {seconds:.0f} s" for step, seconds in build.seconds.items())
    print(f"CPU serving image {build.tag}: " + (f"built ({timings}; log {log})" if build.built else "up to date"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
