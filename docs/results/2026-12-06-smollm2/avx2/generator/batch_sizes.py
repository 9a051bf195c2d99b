"""Our data generator alone at several batch sizes, in the target's auto dtype (packed fp32 on an AVX2 CPU).

    python docs/results/2026-12-06-smollm2/avx2/generator/batch_sizes.py 32 64 128   # -> batch_sizes.txt

Each batch size answers its own 2 x batch prompts (consecutive slices of the default mix's file and passage
sources), greedy, 128 new tokens. Prints generated tokens/s per batch size. Run it alone.
"""

import sys
import time

import torch

from headway.config import load_config
from headway.data.generate import generate_batch
from headway.data.sources import benchmark_prompts
from headway.target import load_target, stop_token_ids

cfg = load_config("configs/smollm2-135m/data.yaml")
model, tok = load_target(cfg.target)
eos = stop_token_ids(model, tok)
prompts = benchmark_prompts(cfg.data, tok)
print(model.dtype, torch.get_num_threads(), flush=True)
generate_batch(model, prompts[:2], 4, eos)  # warm-up
start = 0
for bs in (int(x) for x in sys.argv[1:]):
    batch = prompts[start : start + 2 * bs]
    start += 2 * bs
    t = time.perf_counter()
    with torch.inference_mode():
        answers = generate_batch(model, batch, 128, eos, batch_size=bs)
    dt = time.perf_counter() - t
    tokens = sum(len(a.tokens) for a in answers)
    print(f"batch {bs}: {tokens} tokens in {dt:.1f} s = {tokens / dt:.1f} tok/s", flush=True)
