# Two commands work on a fresh machine with only python3 and make: `make demo` and `make test`.
# Each installs uv (with pip, into .tools/) if it is missing and syncs .venv from uv.lock.

PYTHON ?= python3
TOOLS := .tools
UV := $(shell command -v uv 2>/dev/null || echo $(TOOLS)/bin/uv)
VENV := .venv
RUN := $(VENV)/bin/python

.PHONY: all demo test check lint typecheck pytest pytest-quick chromium bench fuzz docs docs-check docs-data screenshots clean

all: test

$(TOOLS)/bin/uv:
	$(PYTHON) -m pip install --quiet --disable-pip-version-check --target $(TOOLS) uv

# --compile-bytecode: without .pyc files every process compiles each module it imports, and
# compile() holds the GIL throughout, so a worker thread importing wandb stalls the event loop
# (WandbMonitor.start: 44-59 ms stalls from source, 13-18 ms from bytecode).
$(VENV)/.synced: uv.lock pyproject.toml setup.py encoder/_csize.c encoder/_cround.c Makefile | $(UV)
	PYTHONPATH=$(TOOLS) $(UV) sync --locked --quiet --compile-bytecode
	touch $@

# The main job at a size that takes about two minutes on 2 cores: `nodewise loadtest` with 60
# production-sized episodes through the file, Prime and W&B monitors, and today's way beside
# them (bench.loadtest --baseline). Full size: `.venv/bin/nodewise loadtest` (1,000 episodes).
demo: $(VENV)/.synced
	$(RUN) -m bench.loadtest --episodes 60 --baseline

# Every test, the load tests at full size included, and the docs site.
test: lint typecheck pytest docs

# The everyday loop: lint, types and every test but the production-sized load tests.
check: lint typecheck pytest-quick

lint: $(VENV)/.synced
	$(VENV)/bin/ruff check encoder monitors tests bench fuzz docs
	$(VENV)/bin/ruff format --check encoder monitors tests bench fuzz docs

typecheck: $(VENV)/.synced
	$(VENV)/bin/mypy

pytest: $(VENV)/.synced chromium
	HYPOTHESIS_PROFILE=$${HYPOTHESIS_PROFILE:-ci} $(RUN) -m pytest -p no:cacheprovider

pytest-quick: $(VENV)/.synced chromium
	HYPOTHESIS_PROFILE=$${HYPOTHESIS_PROFILE:-dev} $(RUN) -m pytest -p no:cacheprovider -m "not load"

# The trace browser's tests drive a real headless Chromium (Debian's package): installed with
# apt-get when missing (as root, else through sudo), from the package lists as they are, and
# refreshed only when that fails.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
chromium:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || { \
	  echo "make: installing Debian's chromium for the browser tests"; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  $(SUDO) apt-get install -y -q chromium >/dev/null 2>&1 || \
	  { $(SUDO) apt-get update -q && $(SUDO) apt-get install -y -q chromium; }; }

bench: $(VENV)/.synced
	$(RUN) -m bench
	$(RUN) -m bench.file_monitor
	$(RUN) -m bench.seal
	$(RUN) -m bench.index
	$(RUN) -m bench.prime_monitor
	$(RUN) -m bench.objects
	$(RUN) -m bench.production
	$(RUN) -m bench.adversarial
	$(RUN) -m bench.browser

# Each fuzz target for FUZZ_SECONDS (default 60), exploring with a new seed each time;
# `make test` replays a fixed number of inputs per target from a fixed seed (tests/test_fuzz.py).
fuzz: $(VENV)/.synced
	$(RUN) fuzz/run.py

# The documentation site (mkdocs.yml): --strict fails on any warning, such as a broken link
# or a missing snippet; the benchmark plots are drawn from docs/data/ during the build.
docs: $(VENV)/.synced
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

# Serves site/ on 127.0.0.1 and screenshots two pages in headless Chromium (Debian package
# `chromium`) into site-check/; fails when a page does not render.
docs-check: docs
	$(RUN) docs/check_site.py

# Refreshes the benchmark snapshots the docs draw from (run it on a quiet machine).
docs-data: $(VENV)/.synced
	$(RUN) -m bench --json docs/data/encoder.json > docs/data/encoder.md.tmp
	mv docs/data/encoder.md.tmp docs/data/encoder.md
	$(RUN) -m bench.adversarial --json docs/data/adversarial.json > docs/data/adversarial.md.tmp
	mv docs/data/adversarial.md.tmp docs/data/adversarial.md
	$(RUN) -m bench.file_monitor --quick > docs/data/file_monitor.md.tmp
	mv docs/data/file_monitor.md.tmp docs/data/file_monitor.md
	$(RUN) -m bench.seal --md docs/data/seal.md
	$(RUN) -m bench.prime_monitor > docs/data/prime_monitor.md.tmp
	mv docs/data/prime_monitor.md.tmp docs/data/prime_monitor.md
	$(RUN) -m bench.objects > docs/data/objects.md.tmp
	mv docs/data/objects.md.tmp docs/data/objects.md
	$(RUN) docs/record_lag.py
	$(RUN) -m bench.loadtest --baseline --verbose --no-progress --json docs/data/loadtest.json > docs/data/loadtest.md.tmp
	mv docs/data/loadtest.md.tmp docs/data/loadtest.md
	$(RUN) -m bench.production --skip-full > docs/data/loadtest_big.md.tmp
	mv docs/data/loadtest_big.md.tmp docs/data/loadtest_big.md

# Redraws the trace browser's screenshots in docs/img/ (docs/browser.md) from its browser tests.
screenshots: $(VENV)/.synced chromium
	NODEWISE_SCREENSHOTS=docs/img $(RUN) -m pytest -p no:cacheprovider -q tests/test_browser_page.py

clean:
	rm -rf $(VENV) $(TOOLS) .mypy_cache .ruff_cache .hypothesis fuzz/work site site-check
