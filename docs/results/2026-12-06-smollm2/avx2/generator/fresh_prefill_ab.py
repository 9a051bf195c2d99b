"""The generator with and without the fresh-prefill path of SlotCache, interleaved in one process.

    python docs/results/2026-12-06-smollm2/avx2/generator/fresh_prefill_ab.py 128 128 64 4   # batch, prompts, new tokens, rounds

"gather" forces the old path (every prefill gathers its rows' slots into a zeroed copy); "fresh" is the
code as it is (a prefill of new prompts hands the attention the forward's own keys). Each round draws new
prompts from the default mix's file and passage sources; the arms alternate who goes first. Prints each
arm's seconds per round, whether the answers agree, and the ratio of tokens/s. Run it alone.
"""

import sys
import time

import torch

from headway.config import load_config
from headway.data.generate import generate_batch
from headway.data.sources import benchmark_prompts
from headway.kv import SlotCache
from headway.target import load_target, stop_token_ids

cfg = load_config("configs/smollm2-135m/data.yaml")
model, tok = load_target(cfg.target)
eos = stop_token_ids(model, tok)
prompts = benchmark_prompts(cfg.data, tok)
generate_batch(model, prompts[:2], 4, eos)  # warm-up
fresh_plan = SlotCache.plan


def gather_plan(self, *args):
    width = fresh_plan(self, *args)
    self.fresh = False
    return width


bs, n, new, rounds = (int(x) for x in sys.argv[1:5])
totals = {"fresh": [0, 0.0], "gather": [0, 0.0]}
for r in range(rounds):
    batch = prompts[2000 + r * n : 2000 + (r + 1) * n]
    answers = {}
    for arm in ["fresh", "gather"] if r % 2 == 0 else ["gather", "fresh"]:
        SlotCache.plan = fresh_plan if arm == "fresh" else gather_plan
        t = time.perf_counter()
        with torch.inference_mode():
            out = generate_batch(model, batch, new, eos, batch_size=bs)
        dt = time.perf_counter() - t
        totals[arm][0] += sum(len(a.tokens) for a in out)
        totals[arm][1] += dt
        answers[arm] = [a.tokens for a in out]
        print(r, arm, f"{dt:.1f} s", flush=True)
    print("same answers:", sum(a == b for a, b in zip(answers["fresh"], answers["gather"], strict=True)), "of", n, flush=True)
SlotCache.plan = fresh_plan
for arm, (tokens, seconds) in totals.items():
    print(f"{arm}: {tokens} tokens in {seconds:.1f} s = {tokens / seconds:.1f} tok/s")
print(f"ratio fresh/gather: {(totals['fresh'][0] / totals['fresh'][1]) / (totals['gather'][0] / totals['gather'][1]):.3f}")
