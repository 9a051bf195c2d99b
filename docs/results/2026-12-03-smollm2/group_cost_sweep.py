"""Generated tokens/s of the generator on the mix's prompts by how its decode groups are sized: GROUP_ROWS
(the unit) and DECODE_CALL_SLOTS (0: every group GROUP_ROWS rows, as before session eight; otherwise
`best_sizes` merges neighbours where one wider call costs less than two). Batch 128 (the data config's),
features kept as `data.features` says, rounds interleaved with the order alternating; also how many
answers equal the first setting's (bf16: attention over a wider group can round differently).

    python docs/results/2026-12-03-smollm2/group_cost_sweep.py 384 128 2 8x0 8x1536   # prompts, tokens, rounds, GROUPxCALL_SLOTS

Session eight, at 5068fa8 (model-167 machine, alone; group_cost_sweep.txt): 375 against 375 tokens/s, answers
384/384 equal. Sizing groups by call cost bought nothing, so 5068fa8 was reverted (8c34898) and this script
no longer runs on main (DECODE_CALL_SLOTS and best_sizes are gone). Why: at real sizes the decode attention
reads its keys and values from memory, not cache (decode_step_parts.txt: 128 rows x 400 slots, the bmm is
48% of the step at about 10 GB/s), so the calls' fixed cost that slot_attention_groups.py measured on
in-cache buffers hardly shows.
"""

import sys
import time

import headway.data.generate as G
from headway.config import load_config
from headway.data.distill import data_feature_spec
from headway.data.sources import benchmark_prompts
from headway.target import load_target, stop_token_ids

BATCH = 128
cfg = load_config("configs/smollm2-135m/data.yaml")
model, tok = load_target(cfg.target)
eos = stop_token_ids(model, tok)
prompts = benchmark_prompts(cfg.data, tok)
N, MAX_NEW, ROUNDS = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
settings = [tuple(map(int, s.split("x"))) for s in sys.argv[4:]]  # GROUP_ROWSxDECODE_CALL_SLOTS
capture = data_feature_spec(cfg.data.features, model.config.num_hidden_layers)
G.generate_batch(model, prompts[-4:], 8, eos)

res = {s: [0, 0.0] for s in settings}
for r in range(ROUNDS):
    batch = prompts[r * N : (r + 1) * N]
    answers = {}
    for s in settings if r % 2 == 0 else settings[::-1]:
        got = {}
        jobs = [G._OneAnswer(i, G.Turn(list(p), 0), got.__setitem__) for i, p in enumerate(batch)]
        G.GROUP_ROWS, G.DECODE_CALL_SLOTS = s
        gen = G.Generator(model, BATCH, MAX_NEW, eos, capture=capture)
        t = time.perf_counter()
        gen.run(jobs)
        el = time.perf_counter() - t
        toks = sum(len(a.tokens) for a in got.values())
        answers[s] = got
        res[s][0] += toks
        res[s][1] += el
        print(f"round {r} group_rows {s[0]} call_slots {s[1]}: {toks} tokens in {el:.1f}s = {toks / el:.0f} tok/s", flush=True)
    first = answers[settings[0]]
    for s in settings[1:]:
        same = sum(first[i].tokens == answers[s][i].tokens for i in first)
        print(f"round {r}: {s} answers equal to {settings[0]}'s: {same}/{len(first)}")
for s, (t, e) in res.items():
    print(f"TOTAL group_rows {s[0]} call_slots {s[1]}: {t / e:.0f} tok/s")
