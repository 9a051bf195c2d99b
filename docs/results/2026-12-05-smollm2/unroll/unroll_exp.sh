#!/usr/bin/env bash
# EAGLE-3 on the default mix: 7 unrolled steps against 3, at about the same wall time (alone on the CPU).
set -uo pipefail
cd "$(dirname "$0")/../../../.."; source .venv/bin/activate  # the repository root
OUT=runs/exp; mkdir -p $OUT
N7=${N7:-150}; N3=${N3:-300}
common="train.eval_every=0 train.save_every=0 train.resume=never train.max_eval_rows=200"
for run in u7 u3; do
  if [ $run = u7 ]; then extra="eagle.unroll_steps=7 train.max_steps=$N7"; else extra="eagle.unroll_steps=3 train.max_steps=$N3"; fi
  s=$(date +%s)
  python train/eagle.py --config configs/smollm2-135m/eagle3.yaml train.output_dir=$OUT/$run $common $extra > $OUT/$run.log 2>&1
  echo "$run rc=$? wall $(( $(date +%s) - s )) s: $(tail -1 $OUT/$run.log)"
done
