"""Generated tokens/s of the generator on the mix's prompts for BATCHxGROUP settings, rounds interleaved.
Session six, model-167 machine: 64x8 322, 64x16 313, 64x32 302 (192 prompts x 128 tokens); 64x8 319,
128x8 346, 96x8 309 (256 prompts, one noisy round).

    python docs/results/2026-12-02-smollm2/generator_sweep.py 192 128 1 64x8 64x16 64x32   # prompts, tokens, rounds
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
settings = [tuple(map(int, s.split("x"))) for s in sys.argv[4:]]  # BATCHxGROUP
capture = data_feature_spec(cfg.data.features, model.config.num_hidden_layers)
G.generate_batch(model, prompts[-4:], 8, eos)
res = {s: [0, 0.0] for s in settings}
for r in range(ROUNDS):
    batch = prompts[r * N:(r + 1) * N]
    for s in (settings if r % 2 == 0 else settings[::-1]):
        G.GROUP_ROWS = s[1]
        toks = 0
        def on(i, a):
            global toks
            toks += len(a.tokens)
        jobs = [G._OneAnswer(i, G.Turn(list(p), 0), on) for i, p in enumerate(batch)]
        t = time.perf_counter()
        G.Generator(model, s[0], MAX_NEW, eos, capture=capture).run(jobs)
        el = time.perf_counter() - t
        res[s][0] += toks
        res[s][1] += el
        print(f"round {r} batch {s[0]} group_rows {s[1]}: {toks} tokens in {el:.1f}s = {toks/el:.0f} tok/s", flush=True)
for s, (t, e) in res.items():
    print(f"TOTAL batch {s[0]} group_rows {s[1]}: {t/e:.0f} tok/s")
