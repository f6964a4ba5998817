# luce: `make serve` serves the default model, `make test` runs the tests. Both install what
# they need into .venv first (Python 3.10+ and a C compiler are the only prerequisites).
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.luce-installed
PYTEST_ARGS ?=

.PHONY: all install build test test-real test-gpu models serve bench clean

all: build

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

$(STAMP): setup.py pyproject.toml | $(PY)
	$(PY) -m pip install -q "cython>=3.0" "numpy>=1.24" "setuptools>=64" wheel
	$(PY) -m pip install -q --no-build-isolation -e ".[test]"
	touch $@

install: $(STAMP)

# Rebuilds the Cython extension and, when nvcc exists, the CUDA kernel library (incremental).
build: $(STAMP)
	$(PY) setup.py -q build_ext --inplace

test: build
	$(PY) tools/check_tree.py
	$(PY) -m pytest -q -m "not real" $(PYTEST_ARGS) tests

test-real: build models
	$(PY) -m pytest -q -m real $(PYTEST_ARGS) tests

test-gpu: build
	$(PY) -m pytest -q -m gpu $(PYTEST_ARGS) tests

models: $(STAMP)
	$(PY) tools/fetch_models.py

serve: build models
	$(VENV)/bin/luce-serve

bench: build
	$(PY) tools/bench.py

clean:
	rm -rf build luce/lib luce/*.so luce/_cuda.c *.egg-info
