"""Generated tokens/s of the generator on the mix's prompts by how many free rows it waits for before
refilling (`Generator.refill_rows`; 1 = refill every step, as before session seven), with features kept
as `data.features` says. Rounds interleaved, order alternating; also the share of time in prefill forwards.

    python docs/results/2026-12-03-smollm2/refill_sweep.py 192 128 2 64x1 64x4 64x8 64x16   # prompts, tokens, rounds, BATCHxREFILL
    python docs/results/2026-12-03-smollm2/refill_sweep.py 192 128 2 64x8x4096 64x8x2048    # ... xPREFILL_TOKENS

Session seven, model-167 machine (refill_sweep.txt): refill 1 / 4 / 8 / 16 rows gave 319 / 333 / 332 / 336
tokens/s, prefill 20 / 17 / 16 / 15% of the time; at refill 8, PREFILL_TOKENS 4096 / 2048 gave 340 / 354
(prefill_tokens_sweep.txt).
"""

import sys
import time

import headway.data.generate as G
from headway.config import load_config
from headway.data.distill import data_feature_spec
from headway.data.sources import benchmark_prompts
from headway.target import load_target, stop_token_ids

cfg = load_config("configs/smollm2-135m/data.yaml")
model, tok = load_target(cfg.target)
eos = stop_token_ids(model, tok)
prompts = benchmark_prompts(cfg.data, tok)
N, MAX_NEW, ROUNDS = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
settings = [tuple(map(int, (s + "x4096").split("x")[:3])) for s in sys.argv[4:]]  # BATCHxREFILL[xPREFILL_TOKENS]
capture = data_feature_spec(cfg.data.features, model.config.num_hidden_layers)
G.generate_batch(model, prompts[-4:], 8, eos)

prefill_s = 0.0
feed = G.Generator._feed


def timed_feed(self, cache, rows, idx):
    global prefill_s
    t = time.perf_counter()
    out = feed(self, cache, rows, idx)
    if idx is not None:
        prefill_s += time.perf_counter() - t
    return out


G.Generator._feed = timed_feed
res = {s: [0, 0.0, 0.0] for s in settings}
for r in range(ROUNDS):
    batch = prompts[r * N : (r + 1) * N]
    for s in settings if r % 2 == 0 else settings[::-1]:
        toks = 0

        def on(i, a):
            global toks
            toks += len(a.tokens)

        jobs = [G._OneAnswer(i, G.Turn(list(p), 0), on) for i, p in enumerate(batch)]
        gen = G.Generator(model, s[0], MAX_NEW, eos, capture=capture)
        gen.refill_rows = s[1]
        G.PREFILL_TOKENS = s[2]
        prefill_s = 0.0
        t = time.perf_counter()
        gen.run(jobs)
        el = time.perf_counter() - t
        res[s][0] += toks
        res[s][1] += el
        res[s][2] += prefill_s
        print(f"round {r} batch {s[0]} refill {s[1]} prefill_tokens {s[2]}: {toks} tokens in {el:.1f}s = {toks / el:.0f} tok/s, prefill {prefill_s / el:.0%}", flush=True)
for s, (t, e, p) in res.items():
    print(f"TOTAL batch {s[0]} refill {s[1]} prefill_tokens {s[2]}: {t / e:.0f} tok/s, prefill {p / e:.0%} of the time")
