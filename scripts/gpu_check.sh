#!/usr/bin/env bash
# The GPU check (inference/gpu_check.py): exactness on the device (tiny fp32 targets, bf16 reported),
# then the engine, a few training steps per head type, the verify-cost curve and per-phase step times
# on a randomly initialised Llama-3.1-8B-shaped target. Nothing is downloaded or installed.
#   bash scripts/gpu_check.sh                                   # CUDA, all 32 layers of Llama-3.1-8B
#   bash scripts/gpu_check.sh --layers 8 --out docs/results/gpu_check
#   bash scripts/gpu_check.sh --tiny --device cpu               # the CPU smoke run tests/test_gpu_check.py does
# PYTHON picks the interpreter (default: python). Without headway installed, it runs from this checkout
# through a package view in a temporary folder. The check is stopped after GPU_CHECK_TIMEOUT seconds
# (default 480: it must fit in 8 minutes).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
read -r -a PY <<< "${PYTHON:-python}"
export TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
source scripts/_checkout_view.sh
timeout "${GPU_CHECK_TIMEOUT:-480}" "${PY[@]}" -m headway.inference.gpu_check "$@"
