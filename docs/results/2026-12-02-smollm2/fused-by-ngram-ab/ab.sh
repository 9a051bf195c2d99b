#!/bin/bash
cd /work/main && source .venv/bin/activate
python scripts/evaluate.py --config configs/smollm2-135m/eagle3.yaml --checkpoint runs/mid/eagle3 --per-domain 5 --max-new-tokens 128 --modes fused --out runs/mid/ab-new > /work/notes/s25/ab_new.log 2>&1
git checkout a54bb5a -- inference/allocation.py inference/build.py inference/drafters/fused.py inference/drafters/lookup.py
python scripts/evaluate.py --config configs/smollm2-135m/eagle3.yaml --checkpoint runs/mid/eagle3 --per-domain 5 --max-new-tokens 128 --modes fused --out runs/mid/ab-old > /work/notes/s25/ab_old.log 2>&1
git checkout HEAD -- inference/allocation.py inference/build.py inference/drafters/fused.py inference/drafters/lookup.py
echo done > /work/notes/s25/ab_done
