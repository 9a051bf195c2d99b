"""Batch decode (one query per row, 9 query heads over 3 key heads, bf16): headway.kv._rows_attention, the
data generator's decode attention, against SDPA with enable_gqa; microseconds per layer and the largest
difference between the two.

    python docs/results/2026-12-06-smollm2/gqa-sdpa/rows_bench.py
"""

import torch
import torch.nn.functional as F

from headway.bench import per_call_us
from headway.kv import _rows_attention


def bench(f, n=30):
    return per_call_us(f, n, warmup=3)


dt = torch.bfloat16
for B, S in ((128, 300), (128, 600), (32, 600), (64, 400)):
    q = torch.randn(B, 9, 1, 64, dtype=dt)
    k, v = torch.randn(B, 3, S, 64, dtype=dt), torch.randn(B, 3, S, 64, dtype=dt)
    m = torch.zeros(B, 1, 1, S, dtype=dt)
    m[..., :5] = torch.finfo(dt).min

    def rows(q=q, k=k, v=v, m=m):
        return _rows_attention(q, k, v, m, 0.125)

    def gqa(q=q, k=k, v=v, m=m):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m, enable_gqa=True, scale=0.125).transpose(1, 2)

    diff = (rows().float() - gqa().float()).abs().max().item()
    print(B, S, f"rows {bench(rows):.0f}us sdpa-gqa {bench(gqa):.0f}us max diff {diff:.4f}")
