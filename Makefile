# The two Quick start commands: `make demo` and `make test`. Each creates .venv when missing.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP_CORE := $(VENV)/.installed-core
STAMP_ALL := $(VENV)/.installed-all

.PHONY: demo test lint typecheck bench clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP_CORE): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

$(STAMP_ALL): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[dev,spark]'
	touch $@ $(STAMP_CORE)

demo: $(STAMP_ALL)
	$(BIN)/python examples/demo.py

test: $(STAMP_ALL)
	$(BIN)/python -m pytest

lint: $(STAMP_CORE)
	$(BIN)/ruff check .
	$(BIN)/mypy client broker nameserver spark_connector

bench: $(STAMP_CORE)
	$(BIN)/python -m benchmarks all

clean:
	rm -rf $(VENV) build dist .pytest_cache .mypy_cache .ruff_cache
