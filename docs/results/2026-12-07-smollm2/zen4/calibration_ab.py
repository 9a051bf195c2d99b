"""The auto budget with and without its acceptance calibration, against fixed trees and plain decoding,
interleaved in one process: per Spec-Bench question (first turns) every arm runs back to back, order
rotated. One target, the recipe's int8 drafter weights, 128 new tokens.

    python docs/results/2026-12-07-smollm2/zen4/calibration_ab.py CHECKPOINT 3            # questions per domain
    python docs/results/2026-12-07-smollm2/zen4/calibration_ab.py CHECKPOINT 3 4x2 8x3    # fixed trees: nodes x depth

"auto, raw" is the choice before calibration existed: the measured curve and draft cost with the
validation profile as measured; "auto, fitted" is what scripts/evaluate.py now picks.
"""

import sys

from headway.bench import interleaved
from headway.config import load_config
from headway.data.chat import first_turn_ids
from headway.inference.build import build_engine, retune_budget
from headway.inference.calibration import calibrate
from headway.inference.cost import measure_verify_cost
from headway.inference.questions import load_questions
from headway.paths import resolve_path
from headway.target import load_target, plain_greedy

CKPT, PER_DOMAIN, MAX_NEW = sys.argv[1], int(sys.argv[2]), 128
TREES = [tuple(map(int, a.split("x"))) for a in sys.argv[3:]] or [(4, 2), (6, 3), (8, 3), (12, 3), (16, 4)]
RECIPE = "configs/smollm2-135m/eagle3.yaml"
base = load_config(RECIPE)
target, tok = load_target(base.target)
curve = measure_verify_cost(target)
one = curve[1]
print("verify cost (k new tokens / one): " + ", ".join(f"{k}: {v / one:.2f}x" for k, v in curve.items()))

raw = build_engine(base, CKPT, target, tok, curve=curve)
fitted = build_engine(base, CKPT, target, tok, curve=curve)
cal = calibrate(fitted, tok)
print(f"calibration: {cal.describe()}")
retune_budget(raw, curve, cal.draft_cost, base.inference.max_budget)
retune_budget(fitted, curve, cal.draft_cost, base.inference.max_budget, acceptance_scale=cal.acceptance_scale)
engines = {}
for name, s in (("auto, raw", raw), ("auto, fitted", fitted)):
    t = s.info["tree"]
    print(f"{name}: {t['nodes']} nodes, depth {t['depth']} ({s.info['budget_source']})")
    engines[f"{name} {t['nodes']}n/d{t['depth']}"] = s.engine
for nodes, depth in TREES:
    cfg = load_config(RECIPE, [f"inference.tree_budget={nodes}", f"inference.depth={depth}"])
    engines[f"{nodes}n/d{depth}"] = build_engine(cfg, CKPT, target, tok).engine
accepted = {arm: [] for arm in engines}


def run(arm, ids):
    if arm == "plain":
        return plain_greedy(target, tok, ids, MAX_NEW)
    out = engines[arm].generate([ids], MAX_NEW)
    accepted[arm].extend(out.accepted[0])
    return out.tokens[0]


arms = ["plain", *engines]
warm = first_turn_ids(tok, "Say hello.")
for arm in arms:
    run(arm, warm)
accepted = {arm: [] for arm in engines}
questions = load_questions(resolve_path(base.eval.questions), PER_DOMAIN)
items = [(q.question_id, first_turn_ids(tok, q.turns[0])) for q in questions]
tot = interleaved(arms, items, run)
plain_tps = tot["plain"].tokens_per_s
print(f"{len(items)} questions x {MAX_NEW} new tokens; plain {plain_tps:.1f} tokens/s")
print("| tree | tau | tokens/s | over plain |\n|---|---|---|---|")
for arm in engines:
    tau = 1 + sum(accepted[arm]) / max(1, len(accepted[arm]))
    print(f"| {arm} | {tau:.2f} | {tot[arm].tokens_per_s:.1f} | {tot[arm].tokens_per_s / plain_tps:.3f}x |")
