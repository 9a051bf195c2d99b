"""The same trained drafter with its own weights and with int8 weights (inference.draft_quantization), interleaved.

    python docs/results/2026-12-06-smollm2/avx2/int8-drafter/int8_ab.py --config configs/smollm2-135m/eagle3.yaml \
        --checkpoint runs/ab/eagle3 --per-domain 3 --max-new-tokens 64 [section.key=value ...]

scripts/evaluate.py's runner with two engines built from one checkpoint: the drafter alone with
`draft_quantization: none` and with `int8`, beside plain decoding and HF prompt lookup, each prompt's
methods back to back in a rotating order. Each engine's auto budget is retuned by its own measured
draft cost, as evaluate does. Prints the per-domain table (tau, acceptance by depth, tokens/s,
speedup over plain, identical answers) and the engine phase times (draft ms per step).
"""

from __future__ import annotations

import argparse
import copy

from headway.config import load_config
from headway.data.chat import first_turn_ids
from headway.inference.build import build_engine, retune_budget
from headway.inference.cost import measure_verify_cost
from headway.inference.evaluate import PLD, Runner
from headway.inference.questions import load_questions
from headway.inference.report import build_report, phase_table, table
from headway.paths import resolve_path
from headway.target import context_length, load_target

p = argparse.ArgumentParser()
p.add_argument("--config", required=True)
p.add_argument("--checkpoint", required=True)
p.add_argument("--per-domain", type=int, default=3)
p.add_argument("--max-new-tokens", type=int, default=64)
p.add_argument("overrides", nargs="*")
args = p.parse_args()

cfg = load_config(args.config, [*args.overrides, "inference.drafter=drafter", "inference.draft_quantization=none"])
cfg_q = copy.deepcopy(cfg)
cfg_q.inference.draft_quantization = "int8"
target, tok = load_target(cfg.target)
curve = measure_verify_cost(target)
plain = build_engine(cfg, args.checkpoint, target, tok, curve=curve)
int8 = build_engine(cfg_q, args.checkpoint, target, tok, curve=curve)
int8.method += "-int8"
print("int8 engine notes:", int8.info["notes"])
setups = {"own": plain, "int8": int8}
runner = Runner(setups, tok, cfg, sorted(plain.engine.eos_ids), context_length(target))
warm = first_turn_ids(tok, "Say hello.")
runner.hf(warm, 8, pld=False, seed=0)
runner.hf(warm, 8, pld=True, seed=0)
calib = first_turn_ids(tok, "Explain in a few sentences why the sky is blue.")
for s in setups.values():
    runner.spec(s.method, warm, 8, seed=0)
    if s.info["budget_source"].startswith("auto"):
        out = runner.spec(s.method, calib, 48, seed=0)[2]
        retune_budget(s, curve, out.timings.get("draft", 0.0) / max(1, sum(map(len, out.accepted))), cfg.inference.max_budget)
    print(f"{s.method}: tree {s.info['tree']} ({s.info['budget_source']})")

questions = load_questions(resolve_path(cfg.eval.questions), args.per_domain)
results = []
for i, q in enumerate(questions):
    results.append(runner.run_question(q, i, args.max_new_tokens, 0))
    print(f"{i + 1}/{len(questions)} {q.domain}", flush=True)
depth = max(s.max_depth for s in setups.values())
meta = {"method": plain.method, "max_new_tokens": args.max_new_tokens, "per_domain": args.per_domain,
        "engines": {s.method: {"tree": s.info["tree"], "budget": s.info["budget"], "notes": s.info["notes"]} for s in setups.values()}}
report = build_report(results, depth, meta, headline=plain.method, pld=PLD)
print(table(report))
print(phase_table(report))
