#!/usr/bin/env bash
# EAGLE-3 on the quickstart's data: 8,192 against 4,096 draft ids (session fifteen probe)
# D is runs/quickstart/data of a finished ./scripts/quickstart.sh (here from a fresh clone at fde3d62); F its EAGLE-3 features
set -euo pipefail
cd /work/main; source .venv/bin/activate
D=/work/fresh/runs/quickstart/data
F=/tmp/qs-e3feat
/usr/bin/time -f "cache: %e s wall, %M KB" python scripts/cache_features.py --config configs/smollm2-135m/eagle3.yaml data.output_dir=$D --out $F
for run in 8192:3 4096:4 4096:3; do
  v=${run%:*}; e=${run#*:}
  echo "== vocab $v epochs $e $(date +%T)"
  /usr/bin/time -f "run v$v e$e: %e s wall, %M KB" python train/eagle.py --config configs/smollm2-135m/eagle3.yaml \
    data.output_dir=$D eagle.feature_cache_dir=$F eagle.draft_vocab_size=$v train.epochs=$e \
    train.output_dir=/tmp/e3ab/v${v}e$e train.eval_every=0 train.save_every=0 train.resume=never
done
echo "== done $(date +%T)"
