"""scripts/evaluate.py in fp32 with the bf16 run's verify-cost curve and draft cost (runs/mid/ab-new),
so fp32's same text meets bf16's tree sizes: a same-text A/B of the fused planner."""
import json
import sys

import headway.inference.evaluate as E
from headway.cli import run_main

rep = json.load(open("runs/mid/ab-new/report.json"))
curve = {int(k): v for k, v in rep["verify_cost"].items()}
E.measure_verify_cost = lambda *a, **k: dict(curve)
_retune = E.retune_budget
E.retune_budget = lambda s, c, d, m: _retune(s, c, rep["draft_cost_s"], m)
sys.exit(run_main(E.main))
