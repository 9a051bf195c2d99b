"""Where the self-written (Magpie) stage spends its time: prefill forwards, decode forwards, sampling.

    python docs/results/2026-12-02-smollm2/profile_magpie_stage.py [N]

Writes N (default 128) first turns of the default mix's `writing` source with the real target in bf16
into a temporary folder, timing `Generator._feed` (split into prefill and decode forwards) and
`Generator._advance` (sampling and bookkeeping). Printed before the top-p change: sampling 32.1 s of
77.1 s (105 ms per step); after: 8.9 s of 56.3 s (21.5 ms per step).
"""

import collections
import sys
import tempfile
import time
from pathlib import Path

import torch

import headway.data.generate as G
from headway.config import load_config
from headway.data.magpie import PromptWriter
from headway.target import load_target

torch.set_num_threads(2)
n = int(sys.argv[1]) if len(sys.argv) > 1 else 128
cfg = load_config("configs/smollm2-135m/data.yaml")
model, tok = load_target(cfg.target, device="cpu", dtype=torch.bfloat16)
seconds, counts = collections.Counter(), collections.Counter()
feed, advance = G.Generator._feed, G.Generator._advance


def timed_feed(self, cache, rows, idx):
    t = time.perf_counter()
    out = feed(self, cache, rows, idx)
    kind = "decode" if idx is None else "prefill"
    seconds[kind] += time.perf_counter() - t
    counts[kind] += 1
    counts["decode_rows"] += len(rows) if idx is None else 0
    return out


def timed_advance(self, rows, idx, logits):
    t = time.perf_counter()
    out = advance(self, rows, idx, logits)
    seconds["advance (sampling)"] += time.perf_counter() - t
    return out


G.Generator._feed, G.Generator._advance = timed_feed, timed_advance
src = next(s for s in cfg.data.sources if s.name == "writing")
writer = PromptWriter(model, tok, Path(tempfile.mkdtemp()), cfg.data, log=lambda *_: None)
t0 = time.perf_counter()
writer(src, "writing", n)
wall = time.perf_counter() - t0
steps = counts["decode"] + counts["prefill"]
print(f"wall {wall:.1f} s; " + ", ".join(f"{k} {v:.1f} s" for k, v in seconds.items()))
print(f"forwards: {counts['prefill']} prefill, {counts['decode']} decode; mean rows per decode step "
      f"{counts['decode_rows'] / max(1, counts['decode']):.1f}; sampling {1000 * seconds['advance (sampling)'] / steps:.1f} ms per step")
