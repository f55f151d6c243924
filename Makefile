# tiersim: two commands on a fresh machine (Python 3.11 + pip):
#   make demo   -> creates .venv, installs tiersim, simulates 70b on a100x8 with zero-offload
#   make test   -> creates .venv with the dev extras, runs the whole test suite
#   make lint   -> ruff (complexity bound 20 in policies/ and planner/) and mypy over every package
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# Every top-level package of the source tree (a folder holding an __init__.py): mypy checks them all, so a
# package that lands later (costs/) is checked from the commit that adds it, and none can be forgotten.
PACKAGES := $(sort $(patsubst %/__init__.py,%,$(wildcard */__init__.py)))

.PHONY: demo test bench bench-table validate lint clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.installed: $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install -q -e .
	touch $@

$(VENV)/.installed-dev: $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $@ $(VENV)/.installed

demo: $(VENV)/.installed
	$(BIN)/simulate --hw a100x8 --model 70b --policy zero-offload

test: $(VENV)/.installed-dev
	$(BIN)/python -m pytest -q

# every benchmark; the speed table of issue 13 (ratios to 1 M raw SimPy timeouts, targets, met / not met) is
# tests/benchmarks/test_bench_ratios.py, alone with `make bench-table`
bench: $(VENV)/.installed-dev
	$(BIN)/python -m pytest -q -m benchmark -s tests

bench-table: $(VENV)/.installed-dev
	$(BIN)/python -m pytest -q -m benchmark -s tests/benchmarks/test_bench_ratios.py

validate: $(VENV)/.installed
	$(BIN)/tiersim validate

lint: $(VENV)/.installed-dev
	$(BIN)/python -m ruff check .
	$(BIN)/python -m mypy $(PACKAGES)

clean:
	rm -rf $(VENV) build *.egg-info .mypy_cache .ruff_cache
