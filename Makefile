# mme toolkit: every target wraps the `mme` command line; run `make help`.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
MME := $(BIN)/mme

MODEL ?= resnet50
FORMATS ?= torchscript,onnx,cpu-local
OUT ?= artifacts
ARGS ?=
PYTEST_ARGS ?=

.DEFAULT_GOAL := help
.PHONY: help install package demo test test-gpu bench-package bench-front bench-cold-start clean lock

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*## "}; {printf "  make %-14s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml constraints.txt
	@echo "==> creating $(VENV) (first run takes a few minutes: torch is large)"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --disable-pip-version-check -q -c constraints.txt -e '.[dev]'
	@touch $(STAMP)

install: $(STAMP) ## create .venv with the pinned dependencies (on demand for every target)

package: $(STAMP) ## export, validate and lay out MODEL (make package MODEL=resnet50 FORMATS=onnx ARGS=--no-pretrained)
	$(MME) package $(MODEL) --formats $(FORMATS) --out $(OUT) $(ARGS)

demo: $(STAMP) ## the main job on local defaults (no GPU, no cloud account)
	$(MME) package $(MODEL) --formats $(FORMATS) --out $(OUT) $(ARGS)
	@echo "==> demo done: artifacts in $(OUT)/$(MODEL)/ (manifest.json in each format directory)"

test: $(STAMP) ## run the test suite (GPU tests are skipped without a GPU)
	$(BIN)/pytest $(PYTEST_ARGS)

test-gpu: $(STAMP) ## run only the GPU-marked tests (on a GPU host with `pip install -e '.[gpu]'`)
	$(BIN)/pytest -m gpu $(PYTEST_ARGS)

bench-package: $(STAMP) ## time each packaging stage and the peak memory for MODEL
	$(BIN)/python tests/benchmarks/bench_package.py $(MODEL) --formats $(FORMATS)

bench-front: $(STAMP) ## the local front's added cost over calling Triton directly
	$(BIN)/python tests/benchmarks/bench_front.py

bench-cold-start: $(STAMP) ## cold start of MODEL on the local MME: download, extract, load, first inference
	$(BIN)/python tests/benchmarks/bench_cold_start.py $(OUT)/$(MODEL)/cpu-local

lock: ## regenerate constraints.txt from a fresh resolve of pyproject.toml
	rm -rf .venv-lock && $(PYTHON) -m venv .venv-lock
	.venv-lock/bin/pip install -q -e '.[dev]'
	{ echo '# Full lock of the environment `make install` builds (pip freeze of a resolved install on x86_64, Python 3.11).'; \
	  echo '# Regenerate with `make lock` after changing pyproject.toml.'; \
	  .venv-lock/bin/pip freeze --exclude-editable; } > constraints.txt
	rm -rf .venv-lock

clean: ## remove generated artifacts (keeps .venv)
	rm -rf $(OUT) .pytest_cache
