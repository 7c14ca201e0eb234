# Quick start: `make demo` and `make test`. Both build the virtual environment from nothing
# (idempotent: a stamp file makes a second run instant) and then run.
PYTHON ?= python3.11
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
EPISODES ?= 20

.PHONY: venv demo test lint typecheck unit integration stack-up stack-down schemas clean

venv: $(STAMP)

$(STAMP): pyproject.toml requirements.lock
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -c requirements.lock -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/egoline demo --episodes $(EPISODES)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

test: lint typecheck
	$(BIN)/pytest

unit: $(STAMP)
	$(BIN)/pytest tests/unit

integration: $(STAMP)
	$(BIN)/pytest tests/integration

stack-up: $(STAMP)
	$(BIN)/egoline stack up

stack-down: $(STAMP)
	$(BIN)/egoline stack down

schemas: $(STAMP)
	$(BIN)/egoline schemas export

clean:
	-$(BIN)/egoline stack down
	rm -rf $(VENV) .stack
