# dpclip: `make run` (the default pipeline) and `make test` (the test suite).
# Both create .venv and install the locked dependency set first.

PYTHON ?= python3
# The CPU build of torch. Where pip's default index would give a CUDA build, pass e.g.
#   make TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cpu" run
TORCH_PIP_ARGS ?=
# bash with pipefail: `dvc repro | stage_times` fails when dvc repro does
SHELL  := /bin/bash
.SHELLFLAGS := -o pipefail -c
VENV   ?= .venv
BIN    := $(CURDIR)/$(VENV)/bin
STAMP  := $(VENV)/.installed
export PATH := $(BIN):$(PATH)
# Prefect: start its temporary local API without a 20 s time limit (slow on 2 cores), and no
# telemetry (the machine may be offline).
export PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS ?= 180
export PREFECT_SERVER_ANALYTICS_ENABLED ?= false
export DO_NOT_TRACK ?= 1

.PHONY: install run test clean mlflow-ui prefect-ui dvc.yaml smoke-3.12 smoke-3.13

install: $(STAMP)

$(STAMP): requirements.lock pyproject.toml
	$(PYTHON) -c 'import sys; assert (3, 11) <= sys.version_info[:2] <= (3, 13), "dpclip needs Python 3.11, 3.12 or 3.13"'
	$(PYTHON) -m venv $(VENV)
	# torch first, so nothing later can pull another build (TORCH_PIP_ARGS: its index)
	$(BIN)/pip install --quiet torch==2.13.0 $(TORCH_PIP_ARGS)
	grep -v '^torch==' requirements.lock > $(VENV)/requirements.txt
	$(BIN)/pip install --quiet -r $(VENV)/requirements.txt
	$(BIN)/pip install --quiet --no-deps -e .
	# `dvc plots show` without a network: Vega inline (fetched once from npm, SHA-512 checked)
	$(BIN)/python -m dpclip.reporting.offline_plots || echo "warning: dvc plots show will load Vega from its CDN"
	touch $(STAMP)

# dvc.yaml is generated from the stage declarations (src/dpclip/catalog.py)
dvc.yaml: install
	$(BIN)/python -m dpclip.pipeline.dvc_yaml --write

run: install dvc.yaml
	@start=$$(date +%s); \
	dvc repro 2>&1 | $(BIN)/python -m dpclip.reporting.stage_times && end=$$(date +%s) && \
	echo && cat reports/summary.txt && echo && \
	echo "Every column of every run: reports/comparison.md (.csv); over seeds: reports/seeds.csv" && \
	echo "Figures: reports/*.png, per run: figures/<run>/; dvc plots show; dpclip compare" && \
	echo "dvc repro took $$((end - start)) s." && \
	echo "MLflow UI:  $(VENV)/bin/mlflow ui   (in this folder: the store is mlflow.db, MLflow's default)" && \
	echo "Prefect:    $(VENV)/bin/prefect server start   then   PREFECT_API_URL=http://127.0.0.1:4200/api $(VENV)/bin/python -m flows.serve"

test: install
	$(BIN)/python -m pytest

# Another supported Python (3.12, 3.13; .ci/run runs both): the lock installed into its own
# .venv-<version>, then the tiny pipeline's `dvc repro` and its contract checked there. pip's
# torch for those versions is PyPI's CUDA build (about 3 GB); it runs on the CPU. The
# interpreter: python<version> where it runs, else pyenv's (in PYENV_ROOT, or ~/.pyenv).
smoke-3.12 smoke-3.13: smoke-%:
	@py=$$(for p in python$* $${PYENV_ROOT:-$$HOME/.pyenv}/versions/$*.*/bin/python$*; do \
		$$p -c '' 2> /dev/null && echo $$p && break; done); \
	if [ -z "$$py" ]; then echo "smoke-$*: no Python $* here (python$* on PATH, or" \
		"$${PYENV_ROOT:-$$HOME/.pyenv}/versions/$*.*)"; exit 2; fi; \
	echo "smoke-$*: $$py"; PIP_NO_CACHE_DIR=1 $(MAKE) --no-print-directory VENV=.venv-$* \
		PYTHON=$$py install
	.venv-$*/bin/python -m pytest -q -n0 -p no:cacheprovider \
		tests/test_e2e.py -k contract_metrics

mlflow-ui: install
	$(BIN)/mlflow ui --backend-store-uri sqlite:///$(CURDIR)/mlflow.db

prefect-ui: install
	$(BIN)/prefect server start

# the outputs git does not track, as the stages declare them (dvc.lock, summary/ and overlays/
# are committed)
clean: install
	rm -rf $$($(BIN)/python -m dpclip.pipeline.dvc_yaml --untracked)
