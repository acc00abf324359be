# torchring: `make demo` trains the example on 2 local ranks; `make test` runs every test.
PYTHON ?= python3
TORCH_VERSION ?= 2.13.0
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-torch-$(TORCH_VERSION)
PYTEST_ARGS ?=

.PHONY: venv demo test lint clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet torch==$(TORCH_VERSION)
	$(BIN)/python -m pip install --quiet -e '.[test,examples]'
	@touch $@

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/torchring run -np 2 $(BIN)/python examples/mnist.py

test: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/python -m pip install --quiet ruff
	$(BIN)/ruff check src tests examples

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache
