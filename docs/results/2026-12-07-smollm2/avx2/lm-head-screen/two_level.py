"""Does torch's dynamic int8 linear reproduce an activation grid the caller chose? If so, two calls (the
activation on its 7-bit grid, then the rounding residual on its own) give int8-weight logits whose
bound is that of int8 weights with fp32 activations. (output in two_level.txt)

    python docs/results/2026-12-07-smollm2/avx2/lm-head-screen/two_level.py   # about 2 minutes, alone
"""
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[5]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(Path(__file__).parent))
import lossless_common  # noqa: E402
from screen import timed  # noqa: E402

from headway.config import TargetConfig  # noqa: E402
from headway.int8 import _int8_linear, _prepack  # noqa: E402
from headway.target import load_target  # noqa: E402

LEVELS = 127  # torch's dynamic int8 on x86 without VNNI: 7-bit activations (reduce_range)


def on_grid(x: torch.Tensor) -> torch.Tensor:
    """x rounded to the grid torch's dynamic quantisation picks for it: one scale over the whole tensor,
    zero inside the range."""
    lo, hi = float(min(x.min(), 0)), float(max(x.max(), 0))
    scale = (hi - lo) / LEVELS
    zero = round(-lo / scale)
    return (torch.round(x / scale) + zero).clamp(0, LEVELS).sub(zero) * scale


@torch.inference_mode()
def main() -> None:
    model, tok = load_target(TargetConfig())
    lossless_common.MAX_NEW = 64
    ids = lossless_common.prompts(tok)[:10]
    refs = lossless_common.plain_greedy(model, ids)
    H = torch.cat([model.model(torch.tensor([p + r])).last_hidden_state[0, len(p) - 1 : -1] for p, r in zip(ids, refs, strict=True)])
    W = model.lm_head.weight.float()
    exact = model.lm_head(H)
    packed = _prepack(W, None)
    s = (W.abs().amax(1, keepdim=True) / 127).double()
    Wq = ((W.double() / s).round().clamp(-128, 127) * s)  # what _prepack stores, in float64
    for name, x in (("grid-rounded state, one row per call", None), ("whole batch per call", H)):
        errs = []
        rows = [H[i : i + 1] for i in range(H.shape[0])] if x is None else [x]
        for h in rows:
            g = on_grid(h)
            errs.append((_int8_linear(g, packed).double() - g.double() @ Wq.T).abs().max().item())
        print(f"{name}: max |int8 kernel - exact product on the chosen grid| = {max(errs):.2e} "
              f"(about 0 if the kernel kept the grid)")
    hits = 0
    for i in range(H.shape[0]):
        h = H[i : i + 1]
        g = on_grid(h)
        r = h - g
        a = _int8_linear(g, packed) + _int8_linear(r, packed)
        bound_r = (r.abs().max() * 2 / LEVELS) / 2 * (H.shape[1] ** 0.5)  # residual's own 7-bit rounding, worst case
        eps = (W.double() - Wq).norm(dim=1).float() * h.norm() + Wq.norm(dim=1).float() * bound_r + 1e-3
        top = a.topk(8, -1).indices
        hi_out = (a + eps).scatter(1, top, float("-inf")).amax(-1)
        hits += int(hi_out.item() < exact[i : i + 1].gather(1, top).amax().item() - 1e-3)
    print(f"two calls (grid + residual), top-8 recheck would decide {hits / H.shape[0]:.3f} of {H.shape[0]} positions "
          "IF the kernel kept the grid (it does not: the bound assumes it)")
    h = H[:1].contiguous()
    one = timed(lambda: _int8_linear(h, packed))

    def two_calls():
        g = on_grid(h)
        return _int8_linear(g, packed), _int8_linear(h - g, packed)

    two = timed(two_calls)
    full = timed(lambda: model.lm_head(h))
    print(f"one row: packed fp32 lm_head {full:.2f} ms; one int8 call {one:.2f} ms; grid + residual calls {two:.2f} ms")


if __name__ == "__main__":
    main()
