"""Plain decoding and the EAGLE-3 engine with the target's and the drafter's linear weights pre-packed
(headway/packed.py) against plain nn.Linear, interleaved in one process: per Spec-Bench question the
four runs go back to back, order rotated. The tree is fixed (dynamic, 16 nodes, depth 4, top-k 8) so
both engines draft the same trees; answers are compared token by token.

    python docs/results/2026-12-06-smollm2/packed-weights/engine_ab.py 3   # questions per domain, 128 new tokens
"""

import sys

from headway.bench import ab_table, interleaved
from headway.config import load_config
from headway.data.chat import first_turn_ids
from headway.inference.build import build_engine
from headway.inference.questions import load_questions
from headway.paths import resolve_path
from headway.target import load_target, plain_greedy

PER_DOMAIN, MAX_NEW = int(sys.argv[1]), 128
CKPT = "runs/smollm2-135m/eagle3"
cfgs = {}
for name, pack in (("nn.Linear", False), ("packed", True)):
    cfgs[name] = load_config(
        "configs/smollm2-135m/eagle3.yaml",
        ["inference.tree_budget=16", "inference.depth=4", f"target.pack_weights={str(pack).lower()}"],
    )
plain_model, tok = load_target(cfgs["nn.Linear"].target)
packed_model, _ = load_target(cfgs["packed"].target)
models = {"nn.Linear": plain_model, "packed": packed_model}
engines = {n: build_engine(cfgs[n], CKPT, models[n], tok).engine for n in models}
questions = load_questions(resolve_path(cfgs["packed"].eval.questions), PER_DOMAIN)


def plain(model, ids):
    return plain_greedy(model, tok, ids, MAX_NEW)


runs = [(n, kind) for n in models for kind in ("plain", "eagle3")]
warm = first_turn_ids(tok, "Say hello.")
for n in models:
    plain(models[n], warm)
    engines[n].generate([warm], 8)


def run(arm_kind, ids):
    n, kind = arm_kind
    return plain(models[n], ids) if kind == "plain" else engines[n].generate([ids], MAX_NEW).tokens[0]


items = [(q.question_id, first_turn_ids(tok, q.turns[0])) for q in questions]
tot = interleaved(runs, items, run)
print(*ab_table(tot, list(models), ("plain", "eagle3"), "weights"), sep="\n")
