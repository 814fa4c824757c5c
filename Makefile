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
# make test-integration's parallel workers (pytest-xdist; a test module stays on one worker, so
# the servers it starts once are shared by its tests). 0 runs them in this process.
WORKERS ?= 2
COVERAGE := --cov=mme --cov=packager --cov=serving --cov=sizing --cov=bench --cov-report= --cov-append

.DEFAULT_GOAL := help
.PHONY: help install install-gpu package serve capacity bench report demo demo-realtime demo-fleet demo-cloud cloud test test-integration test-all lint test-gpu bench-package bench-client-cost bench-front bench-cold-start bench-churn bench-crash bench-thrash bench-bomb bench-fleet-instances clean lock

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*## "}; {printf "  make %-14s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml constraints.txt
	@echo "==> creating $(VENV) (first run takes a few minutes: torch is large)"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --disable-pip-version-check -q -c constraints.txt -e '.[dev]'
	@touch $(STAMP)

install: $(STAMP) ## create .venv with the pinned dependencies (on demand for every target)

# TensorRT's -libs package on PyPI is a stub that downloads the real wheel from NVIDIA's
# index at install time, so the gpu extra needs that index reachable (or the builder image).
NVIDIA_INDEX ?= https://pypi.nvidia.com
install-gpu: $(STAMP) ## add the gpu extra (TensorRT of the default release, NVML) to .venv on a GPU host; needs pypi.nvidia.com
	$(BIN)/pip install --disable-pip-version-check -q --extra-index-url $(NVIDIA_INDEX) -c constraints.txt -e '.[dev,gpu]'

package: $(STAMP) ## export, validate and lay out MODEL (make package MODEL=resnet50 FORMATS=onnx ARGS=--no-pretrained)
	$(MME) package $(MODEL) --formats $(FORMATS) --out $(OUT) $(ARGS)

# The steps after package, on one artifact: make serve in one terminal, then make bench and make report.
FORMAT ?= cpu-local
ARTIFACT ?= $(OUT)/$(MODEL)/$(FORMAT)
PORT ?= 8080
MEMORY_LIMIT ?=
RESULTS ?= results
RUN ?= $(shell ls -td $(RESULTS)/*/run.json 2>/dev/null | head -1 | xargs -r dirname)

serve: $(STAMP) ## a local multi-model endpoint on ARTIFACT (default OUT/MODEL/cpu-local) at 127.0.0.1:PORT (8080); Ctrl-C stops
	$(MME) serve --models $(ARTIFACT) --port $(PORT) $(if $(MEMORY_LIMIT),--memory-limit $(MEMORY_LIMIT)) $(ARGS)

capacity: $(STAMP) ## how many copies of ARTIFACT fit under MEMORY_LIMIT (e.g. 2.5G; default this host's), counted as they serve
	$(MME) capacity $(ARTIFACT) --out $(RESULTS) $(if $(MEMORY_LIMIT),--memory-limit $(MEMORY_LIMIT)) $(ARGS)

bench: $(STAMP) ## the staged load test against make serve's endpoint (ARGS='--duration 120 --warmup' for a shorter, warm run)
	$(MME) bench --endpoint local --endpoint-url http://127.0.0.1:$(PORT) --artifact $(ARTIFACT) --out $(RESULTS) $(ARGS)

report: $(STAMP) ## the HTML and Markdown report of RUN (default: the newest run under RESULTS)
	@test -n "$(RUN)" || { echo "make report: no run under $(RESULTS)/; run make bench first, or pass RUN=results/<run-id>"; exit 2; }
	$(MME) report $(RUN) $(ARGS)

cloud: $(STAMP) ## a local SageMaker (hosting, runtime, S3, CloudWatch) for unchanged boto3 scripts and mme commands (ARGS=--port 4566)
	$(MME) cloud $(ARGS)

demo: $(STAMP) ## the main job on local defaults: package, capacity, local MME, staged load, report
	$(MME) demo --model $(MODEL) --out $(OUT) $(ARGS)

demo-fleet: $(STAMP) ## a fleet of tiny models on one local MME: package a catalogue, predict each model's hit ratio, load-test the mix, report predicted vs measured
	$(MME) demo-fleet --out $(OUT) $(ARGS)

demo-cloud: $(STAMP) ## the first article's cloud loop on this machine: push, deploy an MME, staged load, CloudWatch metrics, report, delete (mme cloud, no account)
	$(MME) demo-cloud --out $(OUT) $(ARGS)

demo-realtime: $(STAMP) ## the second article's flow: distilbert on a local real-time endpoint, staged load, report sized for 1000 TPS
	$(MME) demo-realtime --out $(OUT) $(ARGS)

test: $(STAMP) ## the fast tier, before every commit (a few minutes): logic and components against fakes, no real server
	$(BIN)/pytest -m "not integration" $(PYTEST_ARGS)

test-integration: $(STAMP) ## the integration tier: real Triton, moto S3 server, Locust runs and whole mme commands (WORKERS in parallel)
	$(BIN)/pytest -m integration $(if $(filter-out 0,$(WORKERS)),-n $(WORKERS) --dist loadfile) $(PYTEST_ARGS)

test-all: $(STAMP) ## both tiers, as CI runs them, with line coverage per package (printed; coverage/coverage.json)
	rm -f .coverage .coverage.*
	$(MAKE) test PYTEST_ARGS="$(PYTEST_ARGS) $(COVERAGE)"
	$(BIN)/python .ci/coverage_by_package.py --title "fast tier (make test)"
	$(MAKE) test-integration PYTEST_ARGS="$(PYTEST_ARGS) $(COVERAGE)"
	$(BIN)/python .ci/coverage_by_package.py --title "both tiers" --json coverage/coverage.json

lint: $(STAMP) ## ruff (errors, likely bugs, imports at the top but for heavy libraries), mypy and the layer order (import-linter), as CI runs them
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports --no-cache

test-gpu: $(STAMP) ## run only the GPU-marked tests (on a GPU host, after make install-gpu)
	$(BIN)/pytest -m gpu $(PYTEST_ARGS)

bench-package: $(STAMP) ## time each packaging stage and the peak memory for MODEL
	$(BIN)/python benchmarks/bench_package.py $(MODEL) --formats $(FORMATS)

bench-client-cost: $(STAMP) ## client CPU per request: boto3 invoke_endpoint vs the fast signed client
	$(BIN)/python benchmarks/bench_client_cost.py

bench-front: $(STAMP) ## the local front's added cost over calling Triton directly
	$(BIN)/python benchmarks/bench_front.py

bench-cold-start: $(STAMP) $(OUT)/$(MODEL)/cpu-local/manifest.json ## cold start of MODEL on the local MME: download, extract, load, first inference (packages MODEL first when it is not there)
	$(BIN)/python benchmarks/bench_cold_start.py $(OUT)/$(MODEL)/cpu-local

# The artifact a benchmark runs on, packaged with make package's defaults when it is not there yet.
$(OUT)/%/cpu-local/manifest.json: | $(STAMP)
	$(MME) package $* --formats $(FORMATS) --out $(OUT)

bench-churn: $(STAMP) ## warm latency while other models load, and two cold loads at once, on the local MME
	$(BIN)/python benchmarks/bench_load_churn.py

bench-crash: $(STAMP) ## time to first success after a model worker and then Triton are killed under load, on the local MME
	$(BIN)/python benchmarks/bench_crash_recovery.py

bench-thrash: $(STAMP) ## thrash on the local MME: 2,000 copies of a tiny python-backend model, Zipf 1.1, a limit that holds 24; req/s beside the bound its load and unload times set
	$(BIN)/python benchmarks/bench_thrash.py $(ARGS)

bench-bomb: $(STAMP) ## peak disk written while a gzip bomb under the size cap is refused
	$(BIN)/python benchmarks/bench_bomb.py

bench-fleet-instances: $(STAMP) ## the demo fleet on 1, 2, 3 local instances: predicted vs measured hit ratio and instance count
	$(BIN)/python benchmarks/bench_fleet_instances.py $(ARGS)

lock: ## regenerate constraints.txt from a fresh resolve of pyproject.toml
	rm -rf .venv-lock && $(PYTHON) -m venv .venv-lock
	.venv-lock/bin/pip install -q -e '.[dev]'
	{ echo '# Full lock of the environment `make install` builds (pip freeze of a resolved install on x86_64, Python 3.11).'; \
	  echo '# Regenerate with `make lock` after changing pyproject.toml.'; \
	  .venv-lock/bin/pip freeze --exclude-editable; } > constraints.txt
	rm -rf .venv-lock

clean: ## remove generated artifacts (keeps .venv)
	rm -rf $(OUT) .pytest_cache

# --- Docker (GPU hosts) ---
# Images built from the version matrix (mme/versions.toml; `python -m mme.versions --list`):
# the builder (mme package, TensorRT included), the serving image (Triton + mme serve) and
# the slim bench image (Locust via mme bench). Every target prints the command it runs.
DOCKER ?= docker
# The host-side Python that reads the matrix: .venv's, else PYTHON. mme/versions.py reads TOML
# with tomllib (3.11+) or tomli (3.10, e.g. Ubuntu 22.04's python3, where installed). Each
# $(call matrix,ARGS) checks that first and stops make with one line saying what it needs,
# or with mme.versions' own one-line error (an unknown release), never with an empty tag.
MATRIX_PY = $(if $(wildcard $(BIN)/python),$(BIN)/python,$(PYTHON))
comma := ,
matrix_probe = $(shell $(MATRIX_PY) -c 'import importlib.util as u, sys; print("%d.%d" % sys.version_info[:2], any(u.find_spec(m) for m in ("tomllib", "tomli")))' 2>/dev/null)
matrix_needs = make $(or $(MAKECMDGOALS),$(.DEFAULT_GOAL)) needs Python 3.11+, or 3.10 with tomli, to read mme/versions.toml (found $(if $(1),$(firstword $(1)),no Python 3) at $(MATRIX_PY)): pass PYTHON=python3.11$(if $(1),$(comma) or install tomli for it (apt-get install python3-tomli; $(MATRIX_PY) -m pip install --user tomli))
matrix_output = $(if $(filter MATRIX-FAILED,$(1)),$(error make $(or $(MAKECMDGOALS),$(.DEFAULT_GOAL)): $(filter-out MATRIX-FAILED,$(1))),$(1))
matrix = $(if $(filter True,$(matrix_probe)),$(call matrix_output,$(shell $(MATRIX_PY) -m mme.versions $(1) 2>&1 || echo MATRIX-FAILED)),$(error $(call matrix_needs,$(matrix_probe))))
TRITON_RELEASE ?= $(call matrix,--get name)
IMAGE_TAG ?= $(TRITON_RELEASE)
BUILDER_IMAGE ?= mme-builder:$(IMAGE_TAG)
BUILDER_JOB_IMAGE ?= mme-builder:$(IMAGE_TAG)-sagemaker
SERVING_IMAGE ?= mme-serving:$(IMAGE_TAG)
BENCH_IMAGE ?= mme-bench:$(IMAGE_TAG)
DOCKER_FORMATS ?= torchscript,onnx,cpu-local,tensorrt,torch-tensorrt
HF_CACHE ?= $(HOME)/.cache/huggingface
SERVE_FORMAT ?= tensorrt
SERVE_MODELS ?= $(OUT)/$(MODEL)/$(SERVE_FORMAT)
SERVE_BIND ?= 127.0.0.1
SERVE_PORT ?= 8080
SERVE_ARGS ?=
BENCH_CMD ?= bench
BENCH_ARGS ?= --help
docker_build_args = $(call matrix,--build-args --image $(1) --release $(TRITON_RELEASE))

.PHONY: docker-build docker-build-builder docker-build-serving docker-build-bench docker-build-job docker-package docker-serve docker-bench gpu-check gpu-check-wheels

docker-build: docker-build-builder docker-build-serving docker-build-bench ## build the builder, serving and bench images (TRITON_RELEASE: mme/versions.toml default)

docker-build-builder:
	$(DOCKER) build -f docker/builder/Dockerfile -t $(BUILDER_IMAGE) $(call docker_build_args,builder) .

docker-build-job: docker-build-builder ## the builder for SageMaker training jobs (mme package --catalogue --on sagemaker): runs as root, as SageMaker mounts /opt/ml for
	$(DOCKER) build -f docker/builder/job.Dockerfile --build-arg BUILDER_IMAGE=$(BUILDER_IMAGE) -t $(BUILDER_JOB_IMAGE) .

docker-build-serving:
	$(DOCKER) build -f docker/serving/Dockerfile -t $(SERVING_IMAGE) $(call docker_build_args,serving) .

docker-build-bench:
	$(DOCKER) build -f docker/bench/Dockerfile -t $(BENCH_IMAGE) $(call docker_build_args,bench) .

# As your uid:gid, so that OUT's artifacts are yours; the images' HOME is writable by any uid
# (docker/builder/Dockerfile says why).
docker-package: ## mme package MODEL in every format inside the builder image on the GPU (artifacts in OUT)
	@mkdir -p $(OUT) $(HF_CACHE)
	$(DOCKER) run --rm --gpus all --shm-size 2g --user $$(id -u):$$(id -g) -e HF_HOME=/hf-cache -v $(HF_CACHE):/hf-cache -v $(abspath $(OUT)):/artifacts $(BUILDER_IMAGE) package $(MODEL) --formats $(DOCKER_FORMATS) --triton-release $(TRITON_RELEASE) --out /artifacts $(ARGS)

docker-serve: ## mme serve SERVE_MODELS (default OUT/MODEL/tensorrt) on Triton's native backends in the serving image
	if [ -d $(SERVE_MODELS) ]; then $(MATRIX_PY) -c 'import packager.compat' 2>/dev/null || { echo "make docker-serve: checking the engines in $(SERVE_MODELS) runs packager.compat, which needs the project's packages (numpy, ...) in $(MATRIX_PY): run make install PYTHON=python3.11 first" >&2; exit 2; }; $(MATRIX_PY) -m packager.compat --release $(TRITON_RELEASE) $(SERVE_MODELS); fi
	$(DOCKER) run --rm --gpus all --shm-size 2g -p $(SERVE_BIND):$(SERVE_PORT):8080 -v $(abspath $(SERVE_MODELS)):/models:ro $(SERVING_IMAGE) serve --models /models --host 0.0.0.0 --port 8080 --server system $(SERVE_ARGS)

docker-bench: ## mme BENCH_CMD BENCH_ARGS in the slim bench image (host network; OUT read-only at artifacts/, results in results/)
	@mkdir -p results $(OUT)
	$(DOCKER) run --rm --network host --user $$(id -u):$$(id -g) -v $(abspath $(OUT)):/work/artifacts:ro -v $(abspath results):/work/results $(BENCH_IMAGE) $(BENCH_CMD) $(BENCH_ARGS)

GPU_CHECK_OUT ?= results/gpu-check
gpu-check: ## the GPU check (also on a bare GPU host): preflight, Triton GPU copies and in-process copies to the real 90%, TorchScript TF32 off/on, TensorRT (or NOT MEASURED), encoder; exit 3 partial, 4 no GPU
	bash tests/gpu/gpu_check.sh --out $(GPU_CHECK_OUT)

gpu-check-wheels: ## download into .whl/ the wheels of tests/gpu/wheels.txt a bare GPU host (Python 3.12, torch, no network) needs for make gpu-check
	bash tests/gpu/gpu_check.sh --download-wheels .whl
