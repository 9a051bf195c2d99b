#!/usr/bin/env bash
# Which EAGLE-1 feature trains better on SmolLM2-135M: raw pre-norm states (outlier dimensions up to
# |x| ~ 4700), pre-norm states scaled per dimension (statistics from the training data, saved with the
# drafter), or the post-norm states the serving engines feed? Same data, steps, seed; online features.
#     ./scripts/compare_eagle1_features.sh [STEPS] [OUT]
# Prints the validation loss and top-1 accuracy per unrolled step of each variant.
set -euo pipefail
source "$(dirname "$0")/_env.sh"
STEPS=${1:-120}
OUT=${2:-runs/compare-eagle1}
for variant in pre_norm:per_dim pre_norm:none post_norm:none; do
  src=${variant%%:*}; norm=${variant##*:}
  echo "== eagle.feature_source=$src eagle.feature_norm=$norm ($STEPS steps)"
  python train/eagle.py --config configs/smollm2-135m/eagle.yaml eagle.hidden_states=online \
    eagle.feature_source="$src" eagle.feature_norm="$norm" train.output_dir="$OUT/$src-$norm" \
    train.max_steps="$STEPS" train.eval_every="$STEPS" train.save_every="$STEPS" train.max_eval_rows=64 \
    train.resume=never
done
python - "$OUT" <<'PY'
import json, sys
from pathlib import Path
for run in sorted(Path(sys.argv[1]).iterdir()):
    rows = [json.loads(l) for l in (run / "metrics.jsonl").open() if '"validation"' in l]
    if not rows:
        continue
    v = rows[-1]
    acc = " / ".join(f"{v[k]:.3f}" for k in sorted(v) if k.startswith("val/acc_step"))
    print(f"{run.name:16s} step {v['step']}: val loss {v['val/loss']:.3f}  top-1 per step {acc}")
PY
