# kiln — set up, serve, test. Every target installs what it needs first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.kiln-installed
# CPU build of torch that lies on this disk; pinned so that nothing pulls a CUDA build.
# The Dockerfile's TORCH_VERSION is the same pin (torch major.minor is in every tuning key).
TORCH_PIN ?= torch==2.13.0
PYTEST_WORKERS ?= auto
PYTEST := TRITON_INTERPRET=1 $(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadgroup

.PHONY: install serve test test-slow test-all lint browser screenshots clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH_PIN)"
	$(PY) -m pip install -q -e ".[service,dev]"
	touch $@

# Debian's chromium for the dashboard's browser tests (Playwright drives it; no browser download).
# Opt-in and as root (apt-get): without it the browser tests skip.
browser:
	@test -x /usr/bin/chromium || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null)

# Ends its start with the API and dashboard URLs and how to log in (the admin token survives
# restarts). Another port: `make serve PORT=8001` (or `KILN_PORT=8001 make serve`).
serve: install
	$(VENV)/bin/kiln serve $(if $(PORT),--port $(PORT))

# The README's dashboard screenshots from a real run (a fresh `kiln serve`, the examples).
screenshots: install browser
	$(PY) scripts/screenshots.py

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports

# The fast step: ruff and every test not marked slow (a few minutes on 2 cores).
test: install
	$(VENV)/bin/ruff check .
	$(PYTEST) -m "not slow" $(PYTEST_ARGS)

# The slow step: the tests marked slow (whole-model interpreter runs, service processes,
# sm90 precompiles, load tests, fuzzers).
test-slow: install
	$(PYTEST) -m slow $(PYTEST_ARGS)

test-all: test test-slow

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
