# Two set-up commands for a fresh machine: `make docs` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: help venv venv312 lint test test-fast test-ledger test-py312 docs docs-clean serve lab bench-cpu bench-kernel support-matrix plan gpu-setup gpu-check gpu-bundle gpu-carry gpu-rehearse gpu-run clean

help:
	@echo "make docs      - create .venv, install, execute every notebook, build _build/html"
	@echo "make lint      - ruff check and format --check (code at 100 columns, examples and chapters at 88)"
	@echo "make test      - create .venv if needed and run the whole test suite (includes the site build)"
	@echo "make test-fast - unit tests only (no site build, no browser)"
	@echo "make test-ledger - make test, recording every Python process's CPU and XLA compiles; prints where it went"
	@echo "make test-py312- the JAX-facing unit tests again under Python 3.12 with JAX 0.11 (.venv312)"
	@echo "make serve     - build the site if needed, then serve _build/html on http://127.0.0.1:8000"
	@echo "make lab       - open the notebooks in JupyterLab"
	@echo "make bench-cpu - blockwise vs dense reference benchmark (CPU), writes results/"
	@echo "make bench-kernel - the compiled CPU stand-in kernel vs the JAX one (CPU), writes results/"
	@echo "make support-matrix - recompute TE 2.20.2's support matrix on TE's code (CPU), writes results/support_matrix/"
	@echo "make gpu-setup - on a CUDA 12/13 node: JAX with CUDA, cuDNN >= 9.12 check, TE 2.20.2 built against that JAX"
	@echo "make gpu-bundle- download every file of an offline TE install into gpu-bundle/"
	@echo "make gpu-run   - one GPU, no index: build and install gpu-bundle/, gate on TE, time the seed workload, check"
	@echo "make gpu-check - validate real TE against the reference on the GPUs present (replaces the last report)"
	@echo "make gpu-carry - (development) cut gpu-bundle/ for a machine taking 64 MiB per call; print the plan"
	@echo "make gpu-rehearse - (development) play that plan here with TE's real build, in a fresh Python 3.12"

# The venv's installer: uv where pip can install it, else pip; TUTORIAL_INSTALLER=pip forces pip
# (devtools/venv_install.py; devtools/README.md, "The test run", says why and what it saves).
INSTALL := devtools/venv_install.py
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PYTHON) $(INSTALL) $(PY) -e '.[test,docs]'
	touch $(STAMP)

venv: $(STAMP)

# Two workers; a test file is the unit of distribution, so the site build and its browser
# checks (tests/site/test_site.py) stay in one worker and the site is built once.
PYTEST_WORKERS ?= 2
# The run's environment: TCMalloc preloaded when the machine has it (TUTORIAL_FAST_MALLOC=0: glibc's
# malloc) and one OpenBLAS thread (devtools/README.md, "The test run", gives the figures).
RUN_ENV = OPENBLAS_NUM_THREADS=$${OPENBLAS_NUM_THREADS:-1} \
	LD_PRELOAD="$$(bash tests/setup_machine.sh --malloc)$${LD_PRELOAD:+ $$LD_PRELOAD}"
# Bytecode writing allowed (PYTHONDONTWRITEBYTECODE cleared), so a run's processes share .pyc files
PYC = PYTHONDONTWRITEBYTECODE=
# ruff on the code (100 columns) and on what pages show (88: examples/, the chapters' cells)
lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) devtools/lint_notebooks.py

test: $(STAMP) lint
	bash tests/setup_machine.sh
	$(PYC) $(RUN_ENV) $(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile

# make test with every Python process recorded (CPU, XLA compiles, cache hits): devtools/run_ledger.py
LEDGER := test-artifacts/run-ledger.jsonl
test-ledger: $(STAMP)
	mkdir -p test-artifacts && rm -f $(LEDGER)
	$(PY) devtools/run_ledger.py install
	TUTORIAL_RUN_LEDGER=$(CURDIR)/$(LEDGER) $(MAKE) test; rc=$$?; \
	  $(PY) devtools/run_ledger.py uninstall; \
	  $(PY) devtools/run_ledger.py report $(LEDGER); exit $$rc

test-fast: $(STAMP)
	$(PYC) $(RUN_ENV) $(PY) -m pytest -q -m "not slow" -n $(PYTEST_WORKERS) --dist loadfile

# The second tested stack: Python 3.12 with JAX 0.11. The full suite runs on 3.11 + JAX 0.10;
# this leg runs the tests that exercise JAX itself (TE's JAX code on CPU, the reference
# kernels, CP strategies, the facade, the model), which is where a new JAX can break things.
PYTHON312 ?= $(firstword $(wildcard $(HOME)/.pyenv/versions/3.12*/bin/python3.12) $(shell command -v python3.12))
VENV312 := .venv312
PY312_TESTS := tests/te_on_cpu/test_te_on_cpu.py tests/te/test_te_signatures.py \
	tests/core/test_model.py tests/core/test_package_layout.py \
	tests/devtools/test_compile_cache.py tests/site/test_performance_page.py
# TE's JAX code under the new JAX: its queries, one device against the oracles, and CP on four
# devices in float32; the property tests and the rest of the CP matrix run in the 3.11 leg
PY312_SELECT := not validator and not facade_check and not bf16 and not bfloat16 and \
	(not context_parallel_matches_oracle or cp4)
STAMP312 := $(VENV312)/.installed
$(STAMP312): pyproject.toml
	@test -n "$(PYTHON312)" || { echo "test-py312: no python3.12 found; install it (e.g. pyenv install 3.12) or set PYTHON312="; exit 1; }
	test -x $(VENV312)/bin/python || $(PYTHON312) -m venv $(VENV312)
	$(PYTHON312) $(INSTALL) $(VENV312)/bin/python 'jax>=0.11,<0.12' -e '.[test,docs]'
	touch $(STAMP312)

venv312: $(STAMP312)

# Tests, not files, go to the workers (--dist load): most of this selection is one file
test-py312: $(STAMP312)
	$(PYC) $(RUN_ENV) $(VENV312)/bin/python -m pytest -q -m "not slow" -p no:cacheprovider \
	  -n $(PYTEST_WORKERS) --dist load $(PY312_TESTS) -k "$(PY312_SELECT)"

docs: $(STAMP)
	$(PYC) $(PY) -m sphinx -b html -W --keep-going -j 1 . _build/html

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

bench-kernel: $(STAMP)
	XLA_FLAGS=--xla_force_host_platform_device_count=4 $(PY) benchmarks/bench_cpu_kernel.py

# Every cell runs TE's own fused_attn (forward + backward) on 8 simulated CPU devices: several minutes.
support-matrix: $(STAMP)
	XLA_FLAGS=--xla_force_host_platform_device_count=8 $(PY) -m tutorial_utils.cli.support_matrix

plan: $(STAMP)
	$(PY) -m tutorial_utils.cli.plan --preset seed --hardware GB200

# TE compiles its JAX extension against the installed JAX: keep a preinstalled CUDA JAX (or
# install jax[cuda12|cuda13] for the CUDA found), check cuDNN >= 9.12, install the build's own
# needs (setuptools, wheel, pybind11, cudnn-frontend, the nvtx3 headers), then build TE without
# build isolation (docs/gpu.md).
GPU_SETUP := PYTHONPATH=src $(PY) -m tutorial_utils.cli.gpu_setup
gpu-setup:
	test -x $(PY) || $(PYTHON) -m venv --system-site-packages $(VENV)
	cuda=$$($(GPU_SETUP) cuda) && \
	  ($(PY) -c "import jax; assert jax.default_backend() == 'gpu'" 2>/dev/null || \
	   $(PY) -m pip install "jax[cuda$$cuda]>=0.10,<0.12") && \
	  $(PY) -m pip install $$($(GPU_SETUP) build-requirements --cuda $$cuda) && \
	  $(GPU_SETUP) cudnn && \
	  CPLUS_INCLUDE_PATH=$$($(GPU_SETUP) build-includes)$${CPLUS_INCLUDE_PATH:+:$$CPLUS_INCLUDE_PATH} \
	  NVTE_FRAMEWORK=jax NVTE_NO_LOCAL_VERSION=1 \
	  $(PY) -m pip install --no-build-isolation "transformer-engine[jax,core-cu$$cuda]==2.20.2"
	$(PY) -m pip install -e '.[test,docs]'
	touch $(STAMP)

# One GPU, no package index: `make gpu-bundle` on a machine with an index (GPU_CUDA=12|13 and
# GPU_PYTHON=3.11|3.12 of the node), copy gpu-bundle/ and the repository over, then `make gpu-run`.
GPU_PY ?= python3
GPU_BUNDLE ?= gpu-bundle
GPU_OUT ?= results
GPU_CUDA ?= 13
GPU_PYTHON ?= 3.12
gpu-bundle: $(STAMP)
	$(PY) -m tutorial_utils.cli.gpu_setup bundle $(GPU_BUNDLE) --clean --cuda $(GPU_CUDA) --python-version $(GPU_PYTHON)

gpu-run:
	PYTHONPATH=src $(GPU_PY) -m tutorial_utils.cli.gpu_setup run --bundle $(GPU_BUNDLE) --out $(GPU_OUT)

gpu-check:
	$(PY) -m tutorial_utils.cli.check --out results/checks/gpu-check.json --force

# Development: carry the bundle to a lent machine that takes 64 MiB per call, and rehearse that
# plan here with TE's real build (devtools/README.md, "The GPU run on a lent machine").
CARRY := PYTHONPATH=src $(PY) devtools/gpu_carry.py
gpu-carry: gpu-bundle
	$(CARRY) cut $(GPU_BUNDLE)
	$(CARRY) plan --bundle $(GPU_BUNDLE)

gpu-rehearse: gpu-carry
	$(CARRY) rehearse --bundle $(GPU_BUNDLE)

clean:
	rm -rf _build _build_cache .pytest_cache
