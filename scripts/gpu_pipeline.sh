#!/usr/bin/env bash
# The quickstart's pipeline on whatever device torch finds (CUDA where there is one), at a size that
# runs in a few minutes: self-distillation with kept features, Medusa-1 and EAGLE-3 under
# `accelerate launch` (bf16 autocast) with a checkpoint and a resume, then the per-domain evaluation.
# The target is random (SmolLM2's tokenizer and chat template, 8 small layers), so the accuracies are
# noise: the point is that every stage runs on the device unchanged. Nothing is downloaded.
#   bash scripts/gpu_pipeline.sh TOKENIZER_DIR OUT    # TOKENIZER_DIR: a folder with SmolLM2's tokenizer files
# PYTHON picks the interpreter (default: python). Without headway installed, it runs from this checkout.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
TOK=${1:?usage: gpu_pipeline.sh TOKENIZER_DIR OUT}
OUT=${2:?usage: gpu_pipeline.sh TOKENIZER_DIR OUT}
read -r -a PY <<< "${PYTHON:-python}"
export TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 WANDB_MODE=offline PYTHONUNBUFFERED=1
source scripts/_checkout_view.sh
if "${PY[@]}" -c "import torch, sys; sys.exit(not torch.cuda.is_available())"; then
  ACCEL=configs/accelerate/single_gpu.yaml
else
  ACCEL=configs/accelerate/cpu.yaml
fi
mkdir -p "$OUT"
T=$OUT/target
"${PY[@]}" - "$TOK" "$T" <<'EOF'
import shutil, sys
from pathlib import Path
import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
tok_dir, out = Path(sys.argv[1]), Path(sys.argv[2])
tok = AutoTokenizer.from_pretrained(tok_dir)
config = LlamaConfig(vocab_size=49152, hidden_size=256, intermediate_size=512, num_hidden_layers=8,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                     tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                     pad_token_id=tok.pad_token_id, torch_dtype="bfloat16")
torch.manual_seed(0)
model = LlamaForCausalLM(config).to(torch.bfloat16)
model.save_pretrained(out)
for f in tok_dir.iterdir():
    if f.name.startswith(("tokenizer", "special_tokens", "chat_template")):
        shutil.copy(f, out / f.name)
print(f"random target: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters -> {out}")
EOF
SHAPE=(target.name="$T" target.hidden_size=256 target.num_hidden_layers=8)
lap() { echo "== $1 done at $(( $(date +%s) - start )) s"; }
start=$(date +%s)

# A random target writes no usable prompts of its own, so the self-written sources are left out here.
cat > "$OUT/data.yaml" <<YAML
base: $PWD/configs/smollm2-135m/data.yaml
data:
  sources:
    - {path: data/prompts/gsm8k/train.jsonl, domain: math}
    - {path: data/prompts/gpteacher/codegen-instruct.json, domain: code}
    - {kind: context, task: translate, name: translate_de_en, domain: translation,
       path: data/prompts/passages/vite_docs_de.jsonl, languages: [de-en], min_words: 5, max_words: 80}
    - {kind: context, task: qa, name: passage_qa, domain: rag,
       path: data/prompts/passages/python_docs_es.jsonl, passages: 3, min_words: 20, max_words: 150}
YAML
echo "== 1. self-distillation, features kept ($ACCEL)"
"${PY[@]}" scripts/generate_data.py --config "$OUT/data.yaml" "${SHAPE[@]}" \
  data.output_dir="$OUT/data" data.max_prompts_per_source=6 data.generation.max_new_tokens=48 \
  data.generation.batch_size=16 data.features=[medusa,eagle3]
lap self-distillation

echo "== 2. Medusa-1: 4 steps, checkpoints at 2 and 4; then step 4's checkpoint is removed and the run resumed from 2"
for run in 1 2; do
  "${PY[@]}" -m accelerate.commands.launch --config_file "$ACCEL" train/medusa.py \
    --config configs/smollm2-135m/medusa.yaml "${SHAPE[@]}" data.output_dir="$OUT/data" \
    train.output_dir="$OUT/medusa" train.max_steps=4 train.eval_every=2 train.save_every=2 train.batch_size=4
  [ "$run" = 1 ] && rm -r "$OUT/medusa/checkpoints/step-0000004"
done
lap medusa

echo "== 3. EAGLE-3: 4 steps"
"${PY[@]}" -m accelerate.commands.launch --config_file "$ACCEL" train/eagle.py \
  --config configs/smollm2-135m/eagle3.yaml "${SHAPE[@]}" eagle.feature_layers=[2,4,5] data.output_dir="$OUT/data" \
  train.output_dir="$OUT/eagle3" train.max_steps=4 train.eval_every=2 train.save_every=2 train.batch_size=4
lap eagle3

echo "== 4. per-domain evaluation of the EAGLE-3 drafter"
"${PY[@]}" scripts/evaluate.py --config configs/smollm2-135m/eagle3.yaml "${SHAPE[@]}" eagle.feature_layers=[2,4,5] \
  --checkpoint "$OUT/eagle3" --per-domain 1 --max-new-tokens 24 --out "$OUT/eval"
lap evaluation
