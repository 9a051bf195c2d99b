"""A/B of the generator's decode attention: one KV group (GROUP_ROWS = 64, never resorted) against groups of 8 sorted by
length; the same prompts, interleaved, greedy, bf16, batch 64. Usage: python ab_slot_groups.py PROMPTS_PER_ROUND ROUNDS
"""
import random
import sys
import time

import headway.data.generate as gen
from headway.config import load_config
from headway.data.chat import first_turn_ids
from headway.data.generate import generate_batch
from headway.data.sources import load_conversations
from headway.target import load_target, stop_token_ids

cfg = load_config("configs/smollm2-135m/data.yaml")
model, tok = load_target(cfg.target)
eos = stop_token_ids(model, tok)
convs, _ = load_conversations(cfg.data)
prompts = [first_turn_ids(tok, c.turns[0]) for c in convs]
prompts = [p for p in prompts if len(p) <= 768]
random.Random(0).shuffle(prompts)
n, bs, rounds = int(sys.argv[1]), 64, int(sys.argv[2])
generate_batch(model, prompts[:2], 4, eos)
res = {}
for r in range(rounds):
    batch = prompts[r * n:(r + 1) * n]
    for name in (["one", "grouped"] if r % 2 == 0 else ["grouped", "one"]):
        gen.GROUP_ROWS, gen.SORT_EVERY = (64, 10**9) if name == "one" else (8, 16)
        t = time.perf_counter()
        out = generate_batch(model, batch, 256, eos, batch_size=bs)
        dt = time.perf_counter() - t
        toks = sum(len(a.tokens) for a in out)
        res.setdefault(name, []).append((toks, dt, [a.tokens for a in out]))
        print(f"round {r} {name}: {toks} tokens {dt:.1f}s {toks/dt:.1f} tok/s", flush=True)
    same = sum(a == b for a, b in zip(res["one"][-1][2], res["grouped"][-1][2], strict=True))
    print(f"round {r}: same answers {same}/{n}", flush=True)
for name, v in res.items():
    print(name, f"{sum(t for t,_,_ in v)/sum(d for _,d,_ in v):.1f} tok/s")
