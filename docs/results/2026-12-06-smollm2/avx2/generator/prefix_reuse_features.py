"""Do kept prompt prefixes change what the generator hands on? Answers and captured features with and without reuse.

    python docs/results/2026-12-06-smollm2/avx2/generator/prefix_reuse_features.py 8 48 64   # batch, prompts, new tokens

Runs the same mix prompts (file and passage sources, chat template applied) through the generator twice,
keeping the features every recipe trains on (`data_feature_spec(["medusa", "eagle", "eagle3"])`): once as
the code is, once with MIN_REUSE out of reach (every prompt prefilled from slot 0). Prints how many answers
are equal to the token, how many feature tensors are equal to the bit, and the largest relative difference
||a - b|| / ||b|| per feature key.
"""

import sys

import torch

import headway.data.generate as G
from headway.config import load_config
from headway.data.features import data_feature_spec
from headway.data.sources import benchmark_prompts
from headway.target import load_target, stop_token_ids


class Job:
    def __init__(self, ids):
        self.ids, self.answer, self.features = list(ids), None, None

    def first_turn(self):
        return G.Turn(self.ids)

    def answered(self, answer):
        self.answer = answer.tokens

    def done(self, features):
        self.features = features


cfg = load_config("configs/smollm2-135m/data.yaml")
model, tok = load_target(cfg.target)
eos = stop_token_ids(model, tok)
bs, n, new = (int(x) for x in sys.argv[1:4])
prompts = benchmark_prompts(cfg.data, tok)[5000 : 5000 + n]
spec = data_feature_spec(["medusa", "eagle", "eagle3"], model.config.num_hidden_layers)
runs, reuse_from = {}, G.MIN_REUSE
for arm in ("reuse", "fresh"):
    G.MIN_REUSE = reuse_from if arm == "reuse" else 10**9
    jobs = [Job(p) for p in prompts]
    gen = G.Generator(model, bs, new, eos, capture=spec)
    gen.run(jobs)
    runs[arm] = jobs
    print(arm, "reused prompt tokens:", gen.reused_tokens, flush=True)
G.MIN_REUSE = reuse_from
same = sum(a.answer == b.answer for a, b in zip(runs["reuse"], runs["fresh"], strict=True))
print(f"answers equal to the token: {same} of {n}")
worst, bitwise, total = {}, 0, 0
for a, b in zip(runs["reuse"], runs["fresh"], strict=True):
    if a.answer != b.answer:
        continue
    for key, t in b.features.items():
        total += 1
        bitwise += torch.equal(a.features[key], t)
        rel = float((a.features[key].float() - t.float()).norm() / t.float().norm())
        worst[key] = max(worst.get(key, 0.0), rel)
print(f"feature tensors equal to the bit: {bitwise} of {total}")
for key, rel in worst.items():
    print(f"  {key}: largest ||reuse - fresh|| / ||fresh|| {rel:.2e}")
