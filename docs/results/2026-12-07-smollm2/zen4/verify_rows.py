"""The target's verify forward (decoder + lm_head) for 1-20, 24 and 32 new tokens on a 256-token cache,
medians of 7 rounds (round-robin over sizes, a warm-up round dropped), with no monotone cap: what
`measure_verify_cost` caps, row count by row count. Prints one line of `new tokens: ms`.

    python docs/results/2026-12-07-smollm2/zen4/verify_rows.py   # -> verify_rows.txt
"""

import statistics
import time

import torch
from transformers import DynamicCache

from headway.config import load_config
from headway.inference.layout import additive_mask
from headway.kv import cache_kwarg, crop
from headway.target import load_target

cfg = load_config("configs/smollm2-135m/eagle3.yaml")
model, _ = load_target(cfg.target)
dec, head = model.get_decoder(), model.get_output_embeddings()
dtype = next(model.parameters()).dtype
ctx, sizes = 256, [*range(1, 21), 24, 32]
ids = torch.randint(0, 49152, (1, ctx + 64), generator=torch.Generator().manual_seed(0))
cache = DynamicCache(config=model.config)
with torch.inference_mode():
    dec(input_ids=ids[:, :ctx], use_cache=True, **cache_kwarg(dec, cache))
    masks = {}
    for k in sizes:
        allowed = torch.ones(k, ctx + k, dtype=torch.bool)
        allowed[:, ctx:] = torch.ones(k, k, dtype=torch.bool).tril()
        masks[k] = additive_mask(allowed, dtype)[None, None]
    times = {k: [] for k in sizes}
    for r in range(8):
        for k in sizes:
            t0 = time.perf_counter()
            out = dec(
                input_ids=ids[:, ctx : ctx + k],
                attention_mask=masks[k],
                position_ids=torch.arange(ctx, ctx + k)[None],
                use_cache=True,
                **cache_kwarg(dec, cache),
            )
            head(out.last_hidden_state)
            if r:
                times[k].append(time.perf_counter() - t0)
            crop(cache, ctx)
print(f"{dtype}, {ctx} tokens of context: " + " ".join(f"{k}:{statistics.median(v) * 1000:.1f}" for k, v in times.items()))
