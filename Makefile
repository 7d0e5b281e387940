# Two commands work on a fresh machine with only python3 and make: `make demo` and `make test`.
# Each installs uv (with pip, into .tools/) if it is missing and syncs .venv from uv.lock.

PYTHON ?= python3
TOOLS := .tools
UV := $(shell command -v uv 2>/dev/null || echo $(TOOLS)/bin/uv)
VENV := .venv
RUN := $(VENV)/bin/python

.PHONY: all demo test lint typecheck pytest bench fuzz clean

all: test

$(TOOLS)/bin/uv:
	$(PYTHON) -m pip install --quiet --disable-pip-version-check --target $(TOOLS) uv

$(VENV)/.synced: uv.lock pyproject.toml setup.py encoder/_csize.c | $(UV)
	PYTHONPATH=$(TOOLS) $(UV) sync --locked --quiet
	touch $@

demo: $(VENV)/.synced
	$(RUN) -m bench --quick
	$(RUN) -m bench.file_monitor --quick

test: lint typecheck pytest

lint: $(VENV)/.synced
	$(VENV)/bin/ruff check encoder monitors tests bench fuzz
	$(VENV)/bin/ruff format --check encoder monitors tests bench fuzz

typecheck: $(VENV)/.synced
	$(VENV)/bin/mypy

pytest: $(VENV)/.synced
	HYPOTHESIS_PROFILE=$${HYPOTHESIS_PROFILE:-ci} $(RUN) -m pytest -p no:cacheprovider

bench: $(VENV)/.synced
	$(RUN) -m bench
	$(RUN) -m bench.file_monitor
	$(RUN) -m bench.prime_monitor

# Each fuzz target for FUZZ_SECONDS (default 60); `make test` runs each for a few seconds.
fuzz: $(VENV)/.synced
	$(RUN) fuzz/run.py

clean:
	rm -rf $(VENV) $(TOOLS) .mypy_cache .ruff_cache .hypothesis fuzz/work
