# Two entry points: `make demo` runs the main job, `make test` runs every check CI runs.
# Each creates its own virtualenv in .venv on first use.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test lint unit bench clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

demo: $(BIN)/.installed
	$(BIN)/python scripts/demo.py

lint: $(BIN)/.installed
	$(BIN)/ruff check src tests benchmarks scripts
	$(BIN)/ruff format --check src tests benchmarks scripts
	$(BIN)/mypy
	$(BIN)/lint-imports

# Four pytest workers whatever the cores (the suite mostly waits on processes and the
# cluster), each taking whole modules in the order collected, which puts the slow ones
# first (docs/development.md); --durations lists the slowest tests.
PYTEST_WORKERS := -n 4 --dist loadscope --no-loadscope-reorder

unit: $(BIN)/.installed
	scripts/test.sh $(BIN)/pytest $(PYTEST_WORKERS) --durations=15

test: lint unit

bench: $(BIN)/.installed
	$(BIN)/python benchmarks/placement_scale.py
	$(BIN)/python benchmarks/packing.py

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache .hypothesis
