"""Plain decoding and the EAGLE-3 engine with attention on headway's GQA_SDPA (headway/attention.py:
grouped keys handed to torch's kernel) against transformers' SDPA (keys copied per query head),
interleaved in one process: per Spec-Bench question the four runs go back to back, order rotated.
Weights are pre-packed in both arms; the tree is fixed (dynamic, 16 nodes, depth 4, top-k 8) so both
engines draft the same trees; answers are compared token by token.

    python docs/results/2026-12-06-smollm2/gqa-sdpa/engine_ab.py 3   # questions per domain, 128 new tokens
"""

import sys

from transformers.integrations.sdpa_attention import sdpa_attention_forward

import headway.heads.eagle_attention as eagle_attention
from headway.attention import gqa_sdpa_attention
from headway.bench import ab_table, interleaved
from headway.config import load_config
from headway.data.chat import first_turn_ids
from headway.inference.build import build_engine
from headway.inference.questions import load_questions
from headway.paths import resolve_path
from headway.target import load_target, plain_greedy

PER_DOMAIN, MAX_NEW = int(sys.argv[1]), 128
CKPT = "runs/smollm2-135m/eagle3"
ARMS = ("sdpa", "gqa_sdpa")
cfg = load_config("configs/smollm2-135m/eagle3.yaml", ["inference.tree_budget=16", "inference.depth=4"])
models = {arm: load_target(cfg.target)[0] for arm in ARMS}
tok = load_target(cfg.target)[1]
models["sdpa"].set_attn_implementation("sdpa")  # load_target switched both
engines = {arm: build_engine(cfg, CKPT, models[arm], tok).engine for arm in ARMS}
# The drafter's attention reads this module global at call time: the baseline arm gets transformers' SDPA.
arm_now = {"arm": "gqa_sdpa"}
eagle_attention.gqa_sdpa_attention = lambda *a, **k: (
    gqa_sdpa_attention if arm_now["arm"] == "gqa_sdpa" else sdpa_attention_forward
)(*a, **k)
questions = load_questions(resolve_path(cfg.eval.questions), PER_DOMAIN)
print({arm: models[arm].config._attn_implementation for arm in ARMS})


def plain(model, ids):
    return plain_greedy(model, tok, ids, MAX_NEW)


def run(arm, kind, ids):
    arm_now["arm"] = arm
    return plain(models[arm], ids) if kind == "plain" else engines[arm].generate([ids], MAX_NEW).tokens[0]


runs = [(arm, kind) for arm in ARMS for kind in ("plain", "eagle3")]
warm = first_turn_ids(tok, "Say hello.")
for arm, kind in runs:
    run(arm, kind, warm)
items = [(q.question_id, first_turn_ids(tok, q.turns[0])) for q in questions]
tot = interleaved(runs, items, lambda arm_kind, ids: run(*arm_kind, ids))
print(*ab_table(tot, ARMS, ("plain", "eagle3"), "attention"), sep="\n")
