#!/bin/bash
# fp32 A/B of fused lookup pricing: HEAD (match length) vs a54bb5a (capped candidates); same text in fp32
# Since the commit after these results: scripts/evaluate.py ... --costs-from runs/mid/ab-new/report.json does what eval32.py patches in.
cd /work/main && source .venv/bin/activate
python docs/results/2026-12-02-smollm2/fused-by-ngram-ab32/eval32.py --config configs/smollm2-135m/eagle3.yaml --checkpoint runs/mid/eagle3 --per-domain 5 --max-new-tokens 128 --modes fused --out runs/mid/ab32-new target.dtype=float32 > /tmp/ab32_new.log 2>&1
git checkout a54bb5a -- inference/allocation.py inference/build.py inference/drafters/fused.py inference/drafters/lookup.py
python docs/results/2026-12-02-smollm2/fused-by-ngram-ab32/eval32.py --config configs/smollm2-135m/eagle3.yaml --checkpoint runs/mid/eagle3 --per-domain 5 --max-new-tokens 128 --modes fused --out runs/mid/ab32-old target.dtype=float32 > /tmp/ab32_old.log 2>&1
git checkout HEAD -- inference/allocation.py inference/build.py inference/drafters/fused.py inference/drafters/lookup.py
echo done > /tmp/ab32_done
