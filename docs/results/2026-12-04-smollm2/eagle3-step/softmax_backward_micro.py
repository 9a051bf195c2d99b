"""softmax backward over [B, KV, G, Q, T] bf16 probabilities: the row-block loop of _SoftmaxValues against aten's fused kernel.

    python docs/results/2026-12-04-smollm2/eagle3-step/softmax_backward_micro.py
"""
import time

import torch

torch.manual_seed(0)
B, KV, G, Q, T = 8, 3, 3, 1024, 1024
scale = 0.125
logits = torch.randn(B, KV, G, Q, T) * 3
probs = torch.softmax(logits, -1).to(torch.bfloat16)
dp = torch.randn(B, KV, G, Q, T).to(torch.bfloat16)
dot0 = torch.zeros(B, KV, G, Q, 1)

def loop():
    dot = dot0.clone()
    d_scores = torch.empty_like(dp)
    rows = [t.view(-1, t.shape[-1]) for t in (dp, probs, dot, d_scores)]
    for s in range(0, rows[0].shape[0], 512):
        g, p, row_dot, ds = (t[s : s + 512] for t in rows)
        g, p = g.float(), p[:, :T].float()
        row_dot += torch.matmul(g.unsqueeze(-2), p.unsqueeze(-1)).squeeze(-1)
        torch.mul(g.sub_(row_dot).mul_(p), scale, out=ds)
    return d_scores

def fused():
    ds = torch._softmax_backward_data(dp, probs, -1, torch.bfloat16)
    return ds.mul_(scale)

ref = ((dp.float() - (dp.float() * probs.float()).sum(-1, keepdim=True)) * probs.float() * scale)
for f in (loop, fused, loop, fused):
    f()
    t = time.perf_counter()
    out = f()
    el = time.perf_counter() - t
    err = (out.float() - ref).norm() / ref.norm()
    print(f"{f.__name__:6s} {el*1e3:7.1f} ms  rel err {err:.2e}  threads {torch.get_num_threads()}")
