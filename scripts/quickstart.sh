#!/usr/bin/env bash
# The main job end to end on the built-in default (SmolLM2-135M-Instruct on this machine's CPU):
# creates or reuses .venv, installs headway, prepares the target, then
#   1. self-distills a small prompt mix          -> runs/quickstart/data (+ the heads' features, kept while generating)
#   2. trains Medusa-1 heads on the frozen target -> runs/quickstart/medusa (+ head_accuracy.json)
#   3. evaluates them with tree verification      -> runs/quickstart/eval (per-domain table, report.*)
# The budget is smaller than the full recipes' (52 prompts per source answered in up to 128 tokens, 6 epochs
# of Medusa-1, 3 Spec-Bench questions per domain): the table shows the pipeline working, not the heads' best figures.
# Outputs go under runs/quickstart/ (override with QUICKSTART_DIR). Rerunning resumes finished work.
source "$(dirname "$0")/_env.sh"
OUT=${QUICKSTART_DIR:-runs/quickstart}
PROMPTS_PER_SOURCE=${PROMPTS_PER_SOURCE:-52}   # 64 took 860-973 s on the 2-core model-167 Xeons; on a 2-core Zen 4 56 took 922 s (batch 128), 50 928 s (batch 256)
EPOCHS=${EPOCHS:-6}   # over the recipe's 4,096-id draft vocabulary: head-1 0.374 in 160 s (8,192 x 4: 0.357, ~150 s)
EVAL_PER_DOMAIN=${EVAL_PER_DOMAIN:-3}
EVAL_TOKENS=${EVAL_TOKENS:-64}
ANSWER_TOKENS=${ANSWER_TOKENS:-128}  # twice the evaluation's 64 new tokens; 160 took 1,078 s end to end on a 2-core Zen 4
GEN_BATCH=${GEN_BATCH:-128}          # rows kept busy: 242 against 236 tokens/s at 256 (Zen 4, 700 prompts x 128 tokens, interleaved)
start=$(date +%s)
split=""  # seconds per stage, printed at the end
lap() { local now; now=$(date +%s); split="${split:+$split }$1 $(( now - ${last:-$start} )) s,"; last=$now; }

echo "== preparing the target"
python scripts/prepare_target.py
lap prepare

echo "== 1. self-distillation: the target answers $PROMPTS_PER_SOURCE prompts per source"
python scripts/generate_data.py --config configs/smollm2-135m/data.yaml \
  data.output_dir="$OUT/data" data.max_prompts_per_source="$PROMPTS_PER_SOURCE" \
  data.generation.max_new_tokens="$ANSWER_TOKENS" data.generation.batch_size="$GEN_BATCH" data.features=[medusa]
lap self-distillation

echo "== 2. Medusa-1 heads on the frozen target (resumes from the newest checkpoint)"
python train/medusa.py --config configs/smollm2-135m/medusa.yaml \
  data.output_dir="$OUT/data" train.output_dir="$OUT/medusa" \
  train.epochs="$EPOCHS" train.eval_every=100 train.save_every=100   # ends by writing head_accuracy.json
lap training

echo "== 3. per-domain evaluation: plain vs Medusa tree verification (alone and fused with prompt lookup) vs HF prompt lookup"
echo "   (quickstart budget: $PROMPTS_PER_SOURCE prompts per source answered in up to $ANSWER_TOKENS tokens, $EPOCHS epochs, $EVAL_PER_DOMAIN questions per domain, $EVAL_TOKENS new tokens per turn)"
python scripts/evaluate.py --config configs/smollm2-135m/medusa.yaml --checkpoint "$OUT/medusa" \
  --per-domain "$EVAL_PER_DOMAIN" --max-new-tokens "$EVAL_TOKENS" --out "$OUT/eval" \
  --modes drafter,fused   # our lookup alone is left to the full evaluation: HF's stands for prompt lookup here
lap evaluation

echo "== done in $(( $(date +%s) - start )) s (${split%,}); outputs under $OUT/"
