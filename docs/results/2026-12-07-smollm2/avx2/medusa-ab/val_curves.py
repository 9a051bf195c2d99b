"""Validation top-1 per head over training, for the runs named on the command line (their metrics.jsonl).

    python docs/results/2026-12-07-smollm2/avx2/medusa-ab/val_curves.py runs/ab/medusa runs/ab/medusa-frozen ...
"""
import json
import sys
from pathlib import Path

for run in sys.argv[1:]:
    print(run)
    rows = [json.loads(line) for line in (Path(run) / "metrics.jsonl").open()]
    for r in rows:
        if r["kind"] == "validation":
            print(f"  step {r['step']:4d}  head top-1 " + " / ".join(f"{r[f'val/head{k}/top1']:.3f}" for k in (1, 2, 3, 4))
                  + f"  head-1 loss {r['val/head1/loss']:.3f}")
