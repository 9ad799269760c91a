#!/usr/bin/env bash
# The learning curve (bench/quality.py) on a CUDA machine: the 1M- and 10M-token budgets, trained online (the
# target inside the training loop) and, at 1M, through extract + offline training; the same table as on CPU.
# Needs the package registries for `make setup` (on Linux, PyPI's torch wheel is the CUDA build). The pool holds
# ~1.47M ShareGPT tokens, so the 10M budget is about 7 epochs over it. Held-out prompts: 32 (16 chat, 16 code).
set -euo pipefail
cd "$(dirname "$0")/.."
make setup assets
.venv/bin/python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA device')"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
common=(--held-out 16 --prompts 32 --new-tokens 128)
.venv/bin/python bench/quality.py --budgets 1000000 10000000 --train-mode online "${common[@]}"
.venv/bin/python bench/quality.py --budgets 1000000 --train-mode offline "${common[@]}"
# The draft shapes side by side (EAGLE-3.0 / 3.1, Llama / MLA attention) on the same hidden states, k = 4 and 7.
.venv/bin/python bench/quality.py --budgets 200000 1000000 --train-mode offline --epochs 3 --ttt-steps 7 --ks 4 7 \
    --variants 3.0 3.1 mla-3.0 mla-3.1 "${common[@]}"
