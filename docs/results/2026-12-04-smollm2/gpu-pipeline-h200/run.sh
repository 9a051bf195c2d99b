# Run on the lent H200 (device tool), from the repo root, with .whl holding datasets 5.2.0, dill 0.4.1 and
# multiprocess 0.70.19 (the GPU image lacks them) and .gpu/tokenizer holding SmolLM2's tokenizer files
# (copied from ~/.cache/headway/targets/SmolLM2-135M-Instruct after scripts/prepare_target.py):
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
PYTHON=python3 bash scripts/gpu_pipeline.sh .gpu/tokenizer /tmp/gp 2>&1 | tr '\r' '\n' | grep -v "it/s\]$\|s/it\]$" | tee $OUT/pipeline.log
