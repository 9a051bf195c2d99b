# Run on the lent H200 (device tool) at 33f7d0a, from the repo root; nothing carried (torch 2.11.0+cu130 and
# transformers 5.17.0 are the image's own):
PYTHONUNBUFFERED=1 PYTHON=python3 GPU_CHECK_TIMEOUT=480 bash scripts/gpu_check.sh --out $OUT 2>&1 | tee $OUT/gpu_check.log
