"""The generator's decode attention alone (`_slot_decode_attention`), 64 rows x 256 slots, bf16, by rows
per group. Session six, model-167 machine: groups of 8 1,245 us per layer (37 ms per 30-layer step),
16 972 us, 64 746 us.

    python docs/results/2026-12-02-smollm2/slot_attention_groups.py
"""
import time

import torch

from headway.kv import _slot_decode_attention

torch.manual_seed(0)
B, S, Hq, Hk, D = 64, 256, 9, 3, 64
dt = torch.bfloat16
q = torch.randn(B, Hq, 1, D, dtype=dt)
mask = torch.zeros(B, 1, 1, S, dtype=dt)
for G in (8, 16, 64):
    ks = [torch.randn(G, Hk, S, D, dtype=dt) for _ in range(B // G)]
    vs = [torch.randn(G, Hk, S, D, dtype=dt) for _ in range(B // G)]
    with torch.inference_mode():
        for _ in range(20):
            _slot_decode_attention(None, q, ks, vs, mask)
        t = time.perf_counter()
        for _ in range(300):
            _slot_decode_attention(None, q, ks, vs, mask)
        el = (time.perf_counter() - t) / 300
    print(f"groups of {G}: {el*1e6:.0f} us per layer, x30 layers = {el*30e3:.1f} ms")
