"""Could a cheap int8 or bf16 copy of the target's lm_head decide the fp32 greedy token, with a rigorous
fallback to the full fp32 lm_head? (session thirty-one; output in screen.txt)

    python docs/results/2026-12-07-smollm2/avx2/lm-head-screen/screen.py   # about 2 minutes, run alone

In speculative decoding here the target's fp32 lm_head (49,152 x 576, 113 MB) is read once more per step
after the tree's forward ("accept" in the report: 6.7 ms of a 75.5 ms Medusa step in the session-thirty
quickstart). A screen computes approximate logits a_i from a smaller copy of the weight, with a per-row
error bound eps_i (Cauchy-Schwarz: ||W_i - Wq_i|| ||h||, plus ||Wq_i|| ||h - hq|| where the activation is
rounded). "Top-8 recheck" takes the 8 largest a_i, computes their logits exactly in fp32, and is decided
when every other row's a_j + eps_j lies below the best exact logit (less 1e-3 for rounding): the full
lm_head is then not needed. The real final-normed states come from 10 of the lossless tests' Spec-Bench
prompts answered greedily for 64 tokens (fp32, packed weights, the default here).
"""
import math
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[5]
sys.path.insert(0, str(ROOT / "tests"))
import lossless_common  # noqa: E402

from headway.config import TargetConfig  # noqa: E402
from headway.int8 import _int8_linear, _prepack  # noqa: E402
from headway.target import load_target  # noqa: E402


def timed(f, n=40) -> float:
    for _ in range(5):
        f()
    t = time.perf_counter()
    for _ in range(n):
        f()
    return (time.perf_counter() - t) / n * 1e3


def report(name, approx, eps, exact, k=8):
    lo, hi = approx - eps, approx + eps
    single = (hi >= lo.amax(-1, keepdim=True)).sum(-1) == 1
    top = approx.topk(k, -1).indices
    decided = hi.scatter(1, top, float("-inf")).amax(-1) < exact.gather(1, top).amax(-1) - 1e-3
    print(f"{name:42s} eps median {eps.median().item():6.3f}  max |a - exact| {(approx - exact).abs().max().item():5.3f}  "
          f"one candidate {single.float().mean().item():.3f}  top-{k} recheck decides {decided.float().mean().item():.3f}")


@torch.inference_mode()
def main() -> None:
    torch.manual_seed(0)
    model, tok = load_target(TargetConfig())
    lossless_common.MAX_NEW = 64
    ids = lossless_common.prompts(tok)[:10]
    refs = lossless_common.plain_greedy(model, ids)
    H = torch.cat([model.model(torch.tensor([p + r])).last_hidden_state[0, len(p) - 1 : -1] for p, r in zip(ids, refs, strict=True)])
    exact = model.lm_head(H)
    assert exact.argmax(-1).tolist() == sum(refs, [])
    W = model.lm_head.weight.float()
    gap = exact.topk(2, -1).values
    gap = gap[:, 0] - gap[:, 1]
    print(f"{H.shape[0]} answer positions; ||h|| median {H.norm(dim=-1).median().item():.1f}, max|h| median "
          f"{H.abs().amax(-1).median().item():.1f}; top-1 - top-2 logit gap quantiles 5/10/25/50%: "
          + " / ".join(f"{gap.quantile(q).item():.3f}" for q in (0.05, 0.1, 0.25, 0.5)))

    hn = H.norm(dim=-1, keepdim=True)
    s = W.abs().amax(1, keepdim=True) / 127
    Wq = (W / s).round() * s  # symmetric int8, one scale per row
    dW = (W - Wq).norm(dim=1)[None]
    report("int8 weights, fp32 activations", H @ Wq.T, dW * hn, exact)
    Hb = H.bfloat16().float()
    report("int8 weights, bf16 activations", Hb @ Wq.T, dW * hn + Wq.norm(dim=1)[None] * (H - Hb).norm(dim=-1, keepdim=True), exact)
    mx, mn = H.clamp_min(0).amax(-1, keepdim=True), H.clamp_max(0).amin(-1, keepdim=True)
    sh = (mx - mn) / 127  # torch's dynamic int8 on AVX2: 7-bit activations, one scale per call
    Hq = ((H - mn) / sh).round() * sh + mn
    report("int8 weights, 7-bit activations (exact err)", Hq @ Wq.T, dW * hn + Wq.norm(dim=1)[None] * (H - Hq).norm(dim=-1, keepdim=True), exact)
    report("int8 weights, 7-bit activations (worst err)", Hq @ Wq.T, dW * hn + Wq.norm(dim=1)[None] * math.sqrt(H.shape[1]) * sh / 2, exact)
    Wb = W.bfloat16().float()
    report("bf16 weights, fp32 activations", H @ Wb.T, (W - Wb).norm(dim=1)[None] * hn, exact)

    print("\nms per call, SmolLM2's lm_head (2 threads):")
    packed = _prepack(W, None)
    wq8 = (W / s).round().to(torch.int8)
    wb = W.bfloat16()
    for rows in (1, 2, 3, 8):
        h = H[:rows].contiguous()
        hb = h.bfloat16()
        calls = {
            "packed fp32 (the target's)": lambda h=h: model.lm_head(h),
            "dynamic int8": lambda h=h: _int8_linear(h, packed),
            "int8 weights x bf16 act (_weight_int8pack_mm)": lambda hb=hb: torch._weight_int8pack_mm(hb, wq8, s[:, 0].bfloat16()),
        }
        parts = [f"{name} {timed(f):.2f}" for name, f in calls.items()]
        parts.append(f"bf16 F.linear {timed(lambda hb=hb: torch.nn.functional.linear(hb, wb), 10):.2f}")
        print(f"rows {rows}: " + "; ".join(parts))


if __name__ == "__main__":
    main()
