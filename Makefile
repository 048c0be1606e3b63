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
	$(BIN)/python -m pip install -q --upgrade pip

$(RUNTIME): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e .
	@touch $(RUNTIME)

$(STAMP): pyproject.toml $(RUNTIME)
	$(BIN)/python -m pip install -q -e '.[dev]'
	@touch $(STAMP)

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
