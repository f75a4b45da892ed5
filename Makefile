# kiln — set up, serve, test. Every target installs what it needs first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.kiln-installed
# CPU build of torch that lies on this disk; pinned so that nothing pulls a CUDA build.
# The Dockerfile's TORCH_VERSION is the same pin (torch major.minor is in every tuning key).
TORCH_PIN ?= torch==2.13.0
PYTEST_WORKERS ?= auto

.PHONY: install serve test lint browser screenshots clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH_PIN)"
	$(PY) -m pip install -q -e ".[service,dev]"
	touch $@

# Debian's chromium for the dashboard's browser tests (Playwright drives it; no browser download).
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

test: install browser
	$(VENV)/bin/ruff check .
	TRITON_INTERPRET=1 $(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
