"""One layer of SmolLM2 attention (9 query heads over 3 key heads, 64 dims, float mask): transformers'
repeat_kv + SDPA against SDPA with enable_gqa (and against the query heads packed per key head),
microseconds per call and whether the results are equal to the bit.

    python docs/results/2026-12-06-smollm2/gqa-sdpa/attention_bench.py
"""

import torch
import torch.nn.functional as F

from headway.bench import per_call_us


def bench(f, n=200):
    return per_call_us(f, n, warmup=5)


def variants(q, k, v, m):
    S, Q = k.shape[2], q.shape[2]

    def repeated():
        kk = k[:, :, None].expand(1, 3, 3, S, 64).reshape(1, 9, S, 64)
        vv = v[:, :, None].expand(1, 3, 3, S, 64).reshape(1, 9, S, 64)
        return F.scaled_dot_product_attention(q, kk, vv, attn_mask=m)

    def gqa():
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m, enable_gqa=True)

    def packed():
        o = F.scaled_dot_product_attention(q.reshape(1, 3, 3 * Q, 64), k, v, attn_mask=m.repeat(1, 1, 3, 1))
        return o.reshape(1, 9, Q, 64)

    return repeated, gqa, packed


torch.manual_seed(0)
for dt in (torch.bfloat16, torch.float32):
    for Q, S in ((17, 300), (17, 600), (9, 300), (1, 300)):
        q = torch.randn(1, 9, Q, 64, dtype=dt)
        k, v = torch.randn(1, 3, S, 64, dtype=dt), torch.randn(1, 3, S, 64, dtype=dt)
        m = torch.zeros(1, 1, Q, S, dtype=dt)
        m[..., -Q:] = torch.triu(torch.full((Q, Q), -1e9, dtype=dt), 1)
        rep, gqa, packed = variants(q, k, v, m)
        a, b, c = rep(), gqa(), packed()
        print(dt, Q, S, f"repeat_kv {bench(rep):.0f}us enable_gqa {bench(gqa):.0f}us packed {bench(packed):.0f}us",
              "equal: gqa", torch.equal(a, b), "packed", torch.equal(a, c))
