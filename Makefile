# Quick start: `make demo` (default job on the embedded dataset) and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install demo test test-slow mutants clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 10), "dpgen needs Python >= 3.10"'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	@touch $(STAMP)

install: $(STAMP)

demo: install
	$(BIN)/python scripts/train.py

# One pytest worker per core, one torch thread per worker (tests/conftest.py); modules stay whole on a worker so
# their module-scoped trained runs are built once. The slowest tests are listed at the end.
TEST_ARGS ?= -n auto --dist loadscope --durations=15

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
