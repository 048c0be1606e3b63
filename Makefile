# Quick start: `make demo` (default job on the embedded dataset) and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# `make demo` needs the package only: the test tools (pytest, xdist, the Hydra launchers, nbmake's Jupyter kernel)
# are installed by the first `make test` / `make install`, on top of it.
RUNTIME := $(VENV)/.installed-runtime

.PHONY: install demo test test-slow mutants clean

$(BIN)/python:
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 10), "dpgen needs Python >= 3.10"'
	$(PYTHON) -m venv $(VENV)

$(RUNTIME): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e .
	@touch $(RUNTIME)

# one pip run from a fresh clone: the package with its dev extras also satisfies the demo's runtime stamp
$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[dev]'
	@touch $(RUNTIME) $(STAMP)

install: $(STAMP)

demo: $(RUNTIME)
	$(BIN)/python scripts/train.py

# One pytest worker per core, one torch thread per worker (tests/conftest.py); a module (or a class in it) stays
# whole on a worker so its module-scoped trained runs are built once; the longest units start first
# (conftest.LONGEST_FIRST, in collection order: --no-loadscope-reorder). The slowest tests are listed at the end,
# and any test not marked slow that took over 30 s (--unmarked-limit).
TEST_ARGS ?= -n auto --dist loadscope --no-loadscope-reorder --durations=15

test: install
	$(BIN)/python -m pytest -q $(TEST_ARGS)

test-slow: install
	$(BIN)/python -m pytest -q -m slow $(TEST_ARGS)

# The privacy-mutation gate (tests/privacy_mutants.py): every curated mutant of a privacy-critical line
# must be killed by the tests. Outside `make test` (minutes, not seconds).
mutants: install
	$(BIN)/python tests/privacy_mutants.py

clean:
	rm -rf $(VENV) outputs .pytest_cache

# The one GPU check on an offline node (docs/clusters.md "Offline GPU nodes", docs/performance.md "The GPU check").
# Here, with internet: `make wheelhouse PY=3.12` and `make data` fill wheelhouse/ and .data/ (ignored; carried to the
# node with the repository); the wheels' versions are those of scripts/wheelhouse-constraints.txt, whichever python3
# runs it. On the node: `make gpu-check GPU_BUDGET=6 [GPU_OUT=dir]` installs the wheels the node's python3 lacks into
# GPU_SITE (its torch untouched) and prints one table last (also written to GPU_OUT).
PY         ?= 3.12
WHEELS     ?= wheelhouse
DATA_DIR   ?= .data
FMNIST_SRC ?= /usr/share/datasets/fashion-mnist
GPU_SITE   ?= /tmp/site
GPU_BUDGET ?= 6
GPU_ARGS   ?=
GPU_OUT    ?=

.PHONY: wheelhouse data gpu-check gpu-levers

wheelhouse:
	$(PYTHON) scripts/wheelhouse.py download --python-version $(PY) --dest $(WHEELS)

data:
	$(PYTHON) scripts/wheelhouse.py data --src $(FMNIST_SRC) --dest $(DATA_DIR)/fashion-mnist

# On the node: feta's and GS-WGAN's GPU levers, each beside today's path, in one call (bench/gpu_levers.sh)
gpu-levers:
	GPU_OUT=$(if $(GPU_OUT),$(GPU_OUT),gpu_levers) GPU_SITE=$(GPU_SITE) WHEELS=$(WHEELS) DATA_DIR=$(DATA_DIR) \
	    bash bench/gpu_levers.sh

gpu-check:
	python3 scripts/wheelhouse.py install --wheels $(WHEELS) --target $(GPU_SITE)
	PYTHONPATH=$(GPU_SITE):$(CURDIR) python3 bench/gpu_check.py --budget $(GPU_BUDGET) --data-root $(DATA_DIR) \
	    $(if $(GPU_OUT),--out $(GPU_OUT)) $(GPU_ARGS)
