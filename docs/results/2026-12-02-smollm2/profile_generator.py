"""Where the data generator's time goes: prefill forwards, decode steps and the rest, on the default
mix's file and passage prompts at batch 64 (features kept as `data.features` says, unless `nofeat`).

    python docs/results/2026-12-02-smollm2/profile_generator.py 192 128          # prompts, new tokens
    python docs/results/2026-12-02-smollm2/profile_generator.py 192 128 nofeat
"""

import sys
import time

import torch

import headway.data.generate as G
from headway.config import load_config
from headway.data.distill import data_feature_spec
from headway.data.sources import benchmark_prompts
from headway.target import load_target, stop_token_ids

BATCH = 64

cfg = load_config("configs/smollm2-135m/data.yaml")
model, tok = load_target(cfg.target)
eos = stop_token_ids(model, tok)
prompts = benchmark_prompts(cfg.data, tok)
N = int(sys.argv[1]) if len(sys.argv) > 1 else 192
MAX_NEW = int(sys.argv[2]) if len(sys.argv) > 2 else 128
capture = None if "nofeat" in sys.argv else data_feature_spec(cfg.data.features, model.config.num_hidden_layers)
batch = prompts[:N]
print("prompt tokens mean", sum(map(len, batch)) / N)

spent = {"prefill": [0.0, 0], "decode": [0.0, 0]}  # seconds, forwards
feed = G.Generator._feed


def timed_feed(self, cache, rows, idx):
    t = time.perf_counter()
    out = feed(self, cache, rows, idx)
    s = spent["decode" if idx is None else "prefill"]
    s[0] += time.perf_counter() - t
    s[1] += 1
    return out


G.Generator._feed = timed_feed
G.generate_batch(model, prompts[-4:], 8, eos)  # warm-up
for s in spent.values():
    s[:] = [0.0, 0]
t0 = time.perf_counter()
with torch.inference_mode():
    jobs = [G._OneAnswer(i, G.Turn(list(p), 0), lambda i, a: None) for i, p in enumerate(batch)]
    G.make_generator(model, BATCH, MAX_NEW, eos, None, capture, None).run(jobs)
wall = time.perf_counter() - t0
(pt, pn), (dt, dn) = spent["prefill"], spent["decode"]
print(
    f"wall {wall:.1f}s; prefill {pt:.1f}s in {pn} forwards; decode {dt:.1f}s in {dn} steps "
    f"({1000 * dt / max(1, dn):.1f} ms/step); other {wall - pt - dt:.1f}s"
)
