"""Top-1 by head from each profile named (a run folder's head_accuracy.json, or a profile file itself),
with the quantisation it was scored in.

    python docs/results/2026-12-07-smollm2/avx2/medusa-ab/profiles.py runs/ab/medusa/head_accuracy_int8.json runs/ab/medusa-seed1 ...
"""
import json
import sys
from pathlib import Path

for arg in sys.argv[1:]:
    path = Path(arg) if arg.endswith(".json") else Path(arg) / "head_accuracy.json"
    d = json.loads(path.read_text())
    top1 = " / ".join(f"{acc[0]:.3f}" for acc in d["accuracy"])
    print(f"{path}: {d['draft_quantization']} top-1 {top1} over {d['rows']} rows, positions {d['positions']}")
