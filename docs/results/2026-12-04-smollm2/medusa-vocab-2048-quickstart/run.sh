#!/usr/bin/env bash
# Medusa-1 on the quickstart's data: 4,096 against 2,048 draft ids (session fifteen probe)
# D is runs/quickstart/data of a finished ./scripts/quickstart.sh (fresh clone at fde3d62), its Medusa features kept while generating
set -euo pipefail
cd /work/main; source .venv/bin/activate
D=/work/fresh/runs/quickstart/data
for run in 4096:6 2048:6 2048:8; do
  v=${run%:*}; e=${run#*:}
  echo "== vocab $v epochs $e $(date +%T)"
  /usr/bin/time -f "run v$v e$e: %e s wall, %M KB" python train/medusa.py --config configs/smollm2-135m/medusa.yaml \
    data.output_dir=$D medusa.draft_vocab_size=$v train.epochs=$e \
    train.output_dir=/tmp/mab/v${v}e$e train.eval_every=0 train.save_every=0 train.resume=never
done
echo "== done $(date +%T)"
# then: python train/medusa.py ... medusa.draft_vocab_size=2048 train.epochs=10 train.output_dir=/tmp/mab/v2048e10 (same overrides)
