"""Generated tokens/s of the data generator with the target's linear weights pre-packed (headway/packed.py)
against plain nn.Linear, on the default mix's prompts, features kept as `data.features` says. Rounds
interleaved, order alternating; the answers of the two are compared token by token.

    python docs/results/2026-12-06-smollm2/packed-weights/generator_ab.py 256 128 2 128   # prompts, tokens, rounds, batch
"""

import copy
import sys
import time

import headway.data.generate as G
from headway.config import load_config
from headway.data.distill import data_feature_spec
from headway.data.sources import benchmark_prompts
from headway.packed import pack_linears
from headway.target import load_target, stop_token_ids

cfg = load_config("configs/smollm2-135m/data.yaml")
cfg.target.pack_weights = False
plain, tok = load_target(cfg.target)
packed = copy.deepcopy(plain)
print("packed linears:", pack_linears(packed))
eos = stop_token_ids(plain, tok)
prompts = benchmark_prompts(cfg.data, tok)
N, MAX_NEW, ROUNDS, BATCH = (int(a) for a in sys.argv[1:5])
capture = data_feature_spec(cfg.data.features, plain.config.num_hidden_layers)
models = {"nn.Linear": plain, "packed": packed}
for m in models.values():
    G.generate_batch(m, prompts[-4:], 8, eos)

res = {k: [0, 0.0] for k in models}
answers = {k: {} for k in models}
for r in range(ROUNDS):
    batch = prompts[r * N : (r + 1) * N]
    for name in list(models) if r % 2 == 0 else list(models)[::-1]:
        got = answers[name]

        def on(i, a, got=got, r=r):
            got[(r, i)] = a.tokens

        jobs = [G._OneAnswer(i, G.Turn(list(p), 0), on) for i, p in enumerate(batch)]
        gen = G.Generator(models[name], BATCH, MAX_NEW, eos, capture=capture)
        t = time.perf_counter()
        gen.run(jobs)
        dt = time.perf_counter() - t
        n = sum(len(a) for (rr, _), a in got.items() if rr == r)
        res[name][0] += n
        res[name][1] += dt
        print(f"round {r} {name}: {n} tokens in {dt:.1f} s, {n / dt:.1f} tokens/s", flush=True)
for name, (n, dt) in res.items():
    print(f"{name}: {n} tokens in {dt:.1f} s, {n / dt:.1f} tokens/s")
print(f"packed / nn.Linear: {res['packed'][0] / res['packed'][1] / (res['nn.Linear'][0] / res['nn.Linear'][1]):.3f}x")
same = sum(answers["packed"][k] == answers["nn.Linear"][k] for k in answers["packed"])
print(f"answers identical: {same}/{len(answers['packed'])}")
