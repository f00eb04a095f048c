# Set-up is part of every target: a fresh clone needs only `make demo` or `make test`.
VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin
STORE ?= geocont-results

.PHONY: demo test lint bench clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e ".[dev]"
	touch $@

demo: $(BIN)/.installed
	$(BIN)/geocont sweep launch sweeps/paper_mlp.yaml --store $(STORE)
	$(BIN)/geocont results table --store $(STORE) --sweep paper-mlp --paper mlp

test: $(BIN)/.installed
	$(BIN)/ruff check geocont tests benchmarks dashboards
	$(BIN)/pytest

bench: $(BIN)/.installed
	$(BIN)/python benchmarks/bench_train.py

clean:
	rm -rf $(STORE) .pytest_cache
