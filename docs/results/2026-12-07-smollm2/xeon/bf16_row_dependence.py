"""Which row counts give a bf16 linear row-dependent bits (each row against that row alone), packed
(headway.packed) and plain F.linear, for SmolLM2-135M's shapes, over 1-199 rows.

    python docs/results/2026-12-07-smollm2/xeon/bf16_row_dependence.py
"""
import torch
from torch import nn

from headway.packed import pack_linears

torch.manual_seed(0)
for n_in, n_out in [(576,576),(576,192),(576,1536),(1536,576),(576,49152)]:
    lin = nn.Linear(n_in, n_out, bias=False).to(torch.bfloat16).requires_grad_(False)
    plain = nn.Linear(n_in, n_out, bias=False).to(torch.bfloat16).requires_grad_(False)
    plain.weight.copy_(lin.weight)
    pack_linears(lin)
    xs = torch.randn(200, n_in, dtype=torch.bfloat16)
    with torch.inference_mode():
        alone = torch.cat([lin(xs[i:i+1]) for i in range(200)])
        alone_plain = torch.cat([plain(xs[i:i+1]) for i in range(200)])
        bad_p = [r for r in range(1, 200) if not torch.equal(lin(xs[:r]), alone[:r])]
        bad_f = [r for r in range(1, 200) if not torch.equal(plain(xs[:r]), alone_plain[:r])]
        neq = [r for r in range(1, 200) if not torch.equal(plain(xs[:r]), lin(xs[:r]))]
    print(n_in, n_out, "packed row-dependent:", bad_p[:5], len(bad_p), "| F.linear row-dependent:", bad_f[:5], len(bad_f), "| packed!=F.linear:", neq[:5], len(neq))
