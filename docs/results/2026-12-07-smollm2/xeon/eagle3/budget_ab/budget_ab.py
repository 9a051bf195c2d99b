"""The EAGLE-3 engine at several fixed tree sizes against plain decoding, interleaved in one process:
per Spec-Bench question every arm runs back to back, order rotated. Is the auto budget's choice on this
host (16 nodes, depth 4) the fastest? One target, int8 drafter weights as the recipe sets, 128 new tokens.

    python docs/results/2026-12-07-smollm2/xeon/eagle3/budget_ab/budget_ab.py 3                 # questions per domain
    python docs/results/2026-12-07-smollm2/xeon/eagle3/budget_ab/budget_ab.py 3 4x2 8x3 16x4   # trees: nodes x depth
"""

import sys

from headway.bench import interleaved
from headway.config import load_config
from headway.data.chat import first_turn_ids
from headway.inference.build import build_engine
from headway.inference.questions import load_questions
from headway.paths import resolve_path
from headway.target import load_target, plain_greedy

PER_DOMAIN, MAX_NEW = int(sys.argv[1]), 128
CKPT = "runs/smollm2-135m/eagle3"
TREES = [tuple(map(int, a.split("x"))) for a in sys.argv[2:]] or [(8, 3), (16, 4), (16, 6), (24, 5), (32, 6)]
base = load_config("configs/smollm2-135m/eagle3.yaml")
target, tok = load_target(base.target)
engines = {}
for nodes, depth in TREES:
    cfg = load_config("configs/smollm2-135m/eagle3.yaml", [f"inference.tree_budget={nodes}", f"inference.depth={depth}"])
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
