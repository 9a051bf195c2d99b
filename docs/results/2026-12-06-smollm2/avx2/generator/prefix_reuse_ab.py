"""The generator with and without rows reusing a shared prompt prefix (data/generate.py, MIN_REUSE), interleaved in one process.

    python docs/results/2026-12-06-smollm2/avx2/generator/prefix_reuse_ab.py 64 256 128 2   # batch, prompts, new tokens, rounds
    python docs/results/2026-12-06-smollm2/avx2/generator/prefix_reuse_ab.py 64 256 128 2 before   # "fresh" as the code was before

"reuse" is the code as it is: a refilled row starts past the tokens its next prompt shares with what the
row's last conversation left in its slots (the chat template's system turn). "fresh" sets MIN_REUSE out of
reach, so every prompt is prefilled from slot 0, as before; with `before`, it also gathers as before
(`_SlotLayer._gather` zeroing its whole copy first, not only the slots past a group's width), so the
ratio is that of the code after this change against the code before it. Rows of the first batch have nothing to reuse;
with `prompts` at several times `batch`, most prompts come in as refills, as in a full mix. Each round draws
new prompts from the default mix's file and passage sources; the arms alternate who goes first. Prints each
arm's seconds per round, the prompt tokens reused, whether the answers agree, and the ratio of tokens/s.
Run it alone.
"""

import sys
import time

import torch

import headway.data.generate as G
from headway.config import load_config
from headway.data.generate import Turn, answer_stream
from headway.data.sources import benchmark_prompts
from headway.kv import _SlotLayer
from headway.target import load_target, stop_token_ids

cfg = load_config("configs/smollm2-135m/data.yaml")
model, tok = load_target(cfg.target)
eos = stop_token_ids(model, tok)
prompts = benchmark_prompts(cfg.data, tok)
reuse_from = G.MIN_REUSE
gather_now = _SlotLayer._gather


def gather_before(self, bufs, row_ids, window):
    g = self.owner.group_rows
    out = bufs[0].new_zeros(len(row_ids), bufs[0].shape[1], window, bufs[0].shape[-1])
    for i, r in enumerate(row_ids):
        buf = bufs[r // g]
        width = min(window, buf.shape[2])
        out[i, :, :width] = buf[r % g, :, :width]
    return out


def run(batch, new, bs):
    answers, reused = [None] * len(batch), 0

    class Counting(G.Generator):
        def run(self, jobs):
            nonlocal reused
            super().run(jobs)
            reused = self.reused_tokens

    make = G.make_generator
    G.make_generator = lambda *a, **k: Counting(*a, **k)
    try:
        answer_stream(model, (Turn(list(p)) for p in batch), new, eos, answers.__setitem__, batch_size=bs)
    finally:
        G.make_generator = make
    return answers, reused


answer_stream(model, [Turn(prompts[0])], 4, eos, lambda i, a: None)  # warm-up
bs, n, new, rounds = (int(x) for x in sys.argv[1:5])
before = sys.argv[5:] == ["before"]
totals = {"reuse": [0, 0.0], "fresh": [0, 0.0]}
for r in range(rounds):
    batch = prompts[3000 + r * n : 3000 + (r + 1) * n]
    got = {}
    for arm in ["reuse", "fresh"] if r % 2 == 0 else ["fresh", "reuse"]:
        G.MIN_REUSE = reuse_from if arm == "reuse" else 10**9
        _SlotLayer._gather = gather_before if before and arm == "fresh" else gather_now
        t = time.perf_counter()
        with torch.inference_mode():
            out, reused = run(batch, new, bs)
        dt = time.perf_counter() - t
        totals[arm][0] += sum(len(a.tokens) for a in out)
        totals[arm][1] += dt
        got[arm] = [a.tokens for a in out]
        print(r, arm, f"{dt:.1f} s, prompt tokens {sum(map(len, batch))}, reused {reused}", flush=True)
    print("same answers:", sum(a == b for a, b in zip(got["reuse"], got["fresh"], strict=True)), "of", n, flush=True)
G.MIN_REUSE, _SlotLayer._gather = reuse_from, gather_now
for arm, (tokens, seconds) in totals.items():
    print(f"{arm}: {tokens} tokens in {seconds:.1f} s = {tokens / seconds:.1f} tok/s")
print(f"ratio reuse/fresh: {(totals['reuse'][0] / totals['reuse'][1]) / (totals['fresh'][0] / totals['fresh'][1]):.3f}")
