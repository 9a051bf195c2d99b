"""Generator tokens/s with the slot buffers grown by zeroing only their new slots (tried in session
thirty-seven, not kept: it was slower) against zeroing the whole new buffer first (headway.kv's resize),
arms interleaved over rounds. new_zeros on a large buffer gets zeroed pages from the allocator almost for
free; writing the zeros into new_empty memory does not.

    ROUNDS=4 python docs/results/2026-12-07-smollm2/zen4/session37/bench_resize.py 384 128 128   # prompts, new tokens, batch
"""

import os
import sys
import time

import torch

from headway.config import load_config
from headway.data.generate import generate_batch
from headway.data.sources import benchmark_prompts
from headway.kv import _SlotLayer
from headway.target import load_target, stop_token_ids


def tail_zeroed_resize(self, g: int, capacity: int) -> None:
    """The variant: an empty buffer, the kept slots copied over, only the new slots zeroed."""
    if not self.is_initialized:
        return
    for bufs in (self.keys, self.values):
        old = bufs[g]
        new = old.new_empty(*old.shape[:2], capacity, old.shape[-1])
        keep = min(capacity, old.shape[2])
        new[:, :, :keep] = old[:, :, :keep]
        new[:, :, keep:] = 0
        bufs[g] = new


arms = {"tail-zeroed": tail_zeroed_resize, "zero-all": _SlotLayer.resize}
n, max_new, batch = (int(a) for a in sys.argv[1:4])
cfg = load_config("configs/smollm2-135m/data.yaml")
model, tok = load_target(cfg.target)
eos = stop_token_ids(model, tok)
prompts = benchmark_prompts(cfg.data, tok)[:n]
print(f"{len(prompts)} prompts, {max_new} new tokens, batch {batch}, {model.dtype}, threads {torch.get_num_threads()}", flush=True)
generate_batch(model, prompts[:2], 4, eos)
answers = {}
for rnd in range(int(os.environ.get("ROUNDS", 2))):
    for name in list(arms) if rnd % 2 == 0 else list(arms)[::-1]:
        _SlotLayer.resize = arms[name]
        t = time.perf_counter()
        with torch.inference_mode():
            got = generate_batch(model, prompts, max_new, eos, batch_size=batch)
        s = time.perf_counter() - t
        tokens = sum(len(a.tokens) for a in got)
        print(f"round {rnd} {name}: {tokens} tokens in {s:.1f} s = {tokens / s:.1f} tokens/s", flush=True)
        answers.setdefault(name, [a.tokens for a in got])
same = sum(a == b for a, b in zip(*answers.values(), strict=True))
print(f"answers equal between the arms: {same} of {len(prompts)}")
