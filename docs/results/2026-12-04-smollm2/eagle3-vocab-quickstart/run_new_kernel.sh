#!/usr/bin/env bash
set -euo pipefail
cd /work/main; source .venv/bin/activate
D=/work/fresh/runs/quickstart/data; F=/tmp/qs-e3feat
/usr/bin/time -f "run v8192 e3 (new kernel): %e s wall, %M KB" python train/eagle.py --config configs/smollm2-135m/eagle3.yaml \
  data.output_dir=$D eagle.feature_cache_dir=$F eagle.draft_vocab_size=8192 train.epochs=3 \
  train.output_dir=/tmp/e3ab/v8192e3-new train.eval_every=0 train.save_every=0 train.resume=never
echo "== done $(date +%T)"
