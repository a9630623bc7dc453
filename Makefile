# Two set-up commands for a fresh machine: `make docs` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: help venv test test-fast docs docs-clean serve lab bench-cpu plan gpu-setup gpu-check clean

help:
	@echo "make docs      - create .venv, install, execute every notebook, build _build/html"
	@echo "make test      - create .venv if needed and run the whole test suite (includes the site build)"
	@echo "make test-fast - unit tests only (no site build, no browser)"
	@echo "make serve     - build the site if needed, then serve _build/html on http://127.0.0.1:8000"
	@echo "make lab       - open the notebooks in JupyterLab"
	@echo "make bench-cpu - blockwise vs dense reference benchmark (CPU), writes results/"
	@echo "make gpu-setup - install the GPU extra (jax[cuda12], transformer-engine[jax])"
	@echo "make gpu-check - validate real TE against the reference on the GPUs present"

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,docs]'
	touch $(STAMP)

venv: $(STAMP)

test: $(STAMP)
	bash tests/setup_browser.sh
	$(PY) -m pytest -q

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow"

docs: $(STAMP)
	$(PY) -m sphinx -b html -W --keep-going -j 1 . _build/html

docs-clean:
	rm -rf _build

serve: docs
	@echo "Serving _build/html on http://127.0.0.1:8000 (Ctrl-C to stop)"
	$(PY) -m http.server --directory _build/html --bind 127.0.0.1 8000

lab: $(STAMP)
	$(PY) -m pip install --quiet -e '.[lab]'
	cd notebooks && ../$(VENV)/bin/jupyter lab

bench-cpu: $(STAMP)
	XLA_FLAGS=--xla_force_host_platform_device_count=4 $(PY) benchmarks/bench_reference_cpu.py

plan: $(STAMP)
	$(PY) -m tutorial_utils.plan --preset seed --hardware GB200

# TE compiles its JAX extension against the installed JAX: install JAX first, then TE
# without build isolation (needs the CUDA toolkit headers and cuDNN; see docs/gpu.md).
gpu-setup:
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip setuptools wheel
	$(PY) -m pip install pybind11 ninja cmake 'jax[cuda12]>=0.10,<0.11'
	NVTE_FRAMEWORK=jax $(PY) -m pip install --no-build-isolation 'transformer-engine[jax]==2.20.2'
	$(PY) -m pip install -e '.[test,docs]'
	touch $(STAMP)

gpu-check:
	$(PY) -m tutorial_utils.check --out results/checks/gpu-check.json

clean:
	rm -rf _build .pytest_cache
