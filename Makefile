# The two Quick start commands: `make demo` and `make test`. Each creates .venv when missing.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP_CORE := $(VENV)/.installed-core
STAMP_ALL := $(VENV)/.installed-all

.PHONY: demo test lint typecheck bench clean browser-deps bytecode

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP_CORE): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

$(STAMP_ALL): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[dev,spark]'
	touch $@ $(STAMP_CORE)

# Bytecode of the project's packages, written ahead: where PYTHONDONTWRITEBYTECODE is set (the development machines
# of this project set it) Python writes none, and every server process the demo or the tests start compiled the
# modules again (a broker's imports: 0.5 s of CPU from source, 0.3 s from bytecode). Compiled files are skipped.
bytecode: $(STAMP_ALL)
	$(BIN)/python -m compileall -q common remoting client broker nameserver spark_connector benchmarks

demo: $(STAMP_ALL) bytecode
	$(BIN)/python examples/demo.py

# The dashboard's browser tests drive Debian's headless Chromium (tests/dashboard); install it when missing.
# A no-op when both are present; as non-root it only says what to install (the tests then fail in CI).
BROWSER_PKGS := chromium chromium-driver
browser-deps:
	@if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing $(BROWSER_PKGS) for the dashboard browser tests"; \
		DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(BROWSER_PKGS); \
	else \
		echo "warning: the dashboard browser tests need $(BROWSER_PKGS): sudo apt-get install -y $(BROWSER_PKGS)"; \
	fi

# Most tests wait on servers they start (processes, sockets, JVMs), so two workers take about two thirds of the
# time of one even on two cores; each test file runs whole on one worker (its module fixtures start once), the
# longest files first (tests/conftest.py, LONGEST_FIRST; --no-loadscope-reorder keeps that order).
TEST_WORKERS ?= 2
test: $(STAMP_ALL) browser-deps bytecode
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

lint: $(STAMP_CORE)
	$(BIN)/ruff check .
	$(BIN)/mypy common remoting client broker nameserver spark_connector benchmarks

bench: $(STAMP_CORE)
	$(BIN)/python -m benchmarks all

clean:
	rm -rf $(VENV) build dist .pytest_cache .mypy_cache .ruff_cache
