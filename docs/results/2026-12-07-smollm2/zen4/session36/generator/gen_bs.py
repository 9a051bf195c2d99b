"""Zen 4: generator tokens/s by batch size and dtype, interleaved, same prompts."""
import sys
import time

import torch

from headway.config import load_config
from headway.data.generate import generate_batch
from headway.data.sources import benchmark_prompts
from headway.target import load_target, stop_token_ids

cfg = load_config("configs/smollm2-135m/data.yaml")
n, max_new = int(sys.argv[1]), int(sys.argv[2])
arms = [a.split("@") for a in sys.argv[3:]]  # dtype@batch
models = {}
for dt, _ in arms:
    if dt not in models:
        models[dt] = load_target(cfg.target, dtype=getattr(torch, dt))
model0, tok = next(iter(models.values()))
eos = stop_token_ids(model0, tok)
prompts = benchmark_prompts(cfg.data, tok)[:n]
print(f"{len(prompts)} prompts, max_new {max_new}, threads {torch.get_num_threads()}", flush=True)
for m, _ in models.values():
    generate_batch(m, prompts[:2], 4, eos)
res = {}
for rnd in range(int(__import__('os').environ.get('ROUNDS', 1))):
    for dt, bs in (arms if rnd % 2 == 0 else arms[::-1]):
        m = models[dt][0]
        t = time.perf_counter()
        with torch.inference_mode():
            ans = generate_batch(m, prompts, max_new, eos, batch_size=int(bs))
        s = time.perf_counter() - t
        toks = sum(len(a.tokens) for a in ans)
        print(f"round {rnd} {dt}@{bs}: {toks} tokens in {s:.1f} s = {toks/s:.1f} tok/s", flush=True)
