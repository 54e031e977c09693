# prfaas-testbed: every target depends on the virtualenv, so a fresh clone needs nothing else typed.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
MODEL_STAMP := $(VENV)/.model-installed
TEST_STAMP := $(VENV)/.test-installed
NAME   ?= burst
SUBSTRATE ?= local
ARGS   ?=

.PHONY: install test test-fast chaos lint bench aiperf tokenizer scenario scenarios plan clean help

help:
	@echo "make install             create .venv from pyproject.toml (idempotent)"
	@echo "make scenario NAME=burst run scenarios/NAME.yaml into results/NAME/"
	@echo "                         (NAME=real-model installs the model extra, torch, first)"
	@echo "make scenarios           list the scenario library"
	@echo "make plan NAME=paper     print the planner's table for scenarios/NAME.yaml"
	@echo "make test                run the test suite (what CI runs)"
	@echo "make images              build the compose substrate's images (cached;"
	@echo "                         PROMETHEUS=1 adds the Prometheus server image)"
	@echo "make down                remove every container/network/volume compose runs made"
	@echo "make chaos               short versions of every scenario with faults (pytest -m 'chaos and not model and not routers')"
	@echo "make lint                ruff + mypy + the import-layer check (what CI runs too)"
	@echo "make bench               run the bench/ scripts and print their figures"
	@echo "make aiperf              NVIDIA AIPerf (own .venv-aiperf) against testbed up, vs our records"
	@echo "make tokenizer           rebuild testbed/data/tokenizer (the shipped 512-id tokenizer)"
	@echo "make clean               remove .venv, results/ and caches"

install: $(STAMP)

# Reinstalls whenever pyproject.toml changes.
$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev,compose]'
	@touch $(STAMP)

# The tiny real-model tests need torch (the optional `model` extra); only the tests install it.
$(MODEL_STAMP): $(STAMP)
	$(BIN)/python -m pip install -q -e '.[dev,compose,model]'
	@touch $(MODEL_STAMP)

# The suite also runs `testbed sweep --ray` on a local Ray head (marker `ray`): the ray extra.
$(TEST_STAMP): $(MODEL_STAMP)
	$(BIN)/python -m pip install -q -e '.[dev,compose,model,ray,routers]'
	@touch $(TEST_STAMP)

# --durations=10: every run names its ten slowest tests (the suite's budget: docs/tests.md).
test: $(TEST_STAMP)
	$(BIN)/python -m pytest -q --durations=10

# make test-fast's pytest arguments (tests/test_extension_toys.py reads them from here). -n auto
# (pytest-xdist): the unit tests on every core; the live ones (make test, make chaos) stay one
# at a time, since their processes share the cores.
FAST_ARGS := -n auto -m "not slow and not chaos and not compose and not model and not ray"

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q $(FAST_ARGS)

chaos: $(STAMP)
	$(BIN)/python -m pytest -q -m "chaos and not model and not routers" --durations=10

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/mypy bench
	$(BIN)/python -m testbed.devtools.layers

# bench/aiperf_drive.py installs AIPerf into its own .venv-aiperf and stands a deployment up:
# `make aiperf` runs it, `make bench` does not.
bench: $(STAMP)
	@for f in $(filter-out bench/aiperf_drive.py,$(wildcard bench/*.py)); do echo "== $$f"; $(BIN)/python $$f || exit $$?; done

aiperf: $(STAMP)
	$(BIN)/python bench/aiperf_drive.py $(ARGS)

tokenizer: $(STAMP)
	$(BIN)/python scripts/build_tokenizer.py

# Scenarios on the tiny real model (`engine: torch`) need torch: install the model extra for them
# only, so `make install` stays light for every other scenario.
TORCH_SCENARIOS := real-model
scenario: $(if $(filter $(TORCH_SCENARIOS),$(NAME)),$(MODEL_STAMP),$(STAMP))
	$(BIN)/testbed run scenarios/$(NAME).yaml --substrate $(SUBSTRATE) --out results/$(NAME) $(ARGS)

scenarios: $(STAMP)
	@$(BIN)/testbed scenarios

plan: $(STAMP)
	$(BIN)/testbed plan scenarios/$(NAME).yaml $(ARGS)

clean:
	rm -rf $(VENV) .venv-aiperf results .pytest_cache .mypy_cache .ruff_cache .hypothesis *.egg-info
	find . -name __pycache__ -type d -prune -exec rm -rf {} +

# The compose substrate (docs/compose.md): images built from Debian packages and PyPI wheels
# (cached: a second run takes seconds), and removal of every container/network/volume it made.
.PHONY: images down
images: $(STAMP)
	$(BIN)/python -m testbed.substrate.compose images $(if $(PROMETHEUS),--prometheus)

down: $(STAMP)
	$(BIN)/python -m testbed.substrate.compose down

# The generated references (docs/reference/: the scenario file's fields, the command line), written
# from the code; tests/devtools/test_docgen.py fails when they are stale.
.PHONY: docs
docs: $(STAMP)
	$(BIN)/python -m testbed.cli.docgen
