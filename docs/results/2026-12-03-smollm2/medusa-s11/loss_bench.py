"""Medusa-1 soft-label loss, forward + backward: autograd over [N, V'] logits vs the projected path (heads/soft_ce.py).

    python docs/results/2026-12-03-smollm2/medusa-s11/loss_bench.py

The SmolLM2 recipe's shapes (4 heads, hidden 576, draft vocabulary 8,192, bf16 autocast, batch 8), at a
typical and a long batch. soft_label_weight 1 - 1e-6 takes the autograd path (its hard-label share is a
gather), 1.0 the projected one. Interleaved, 2 warm-up rounds, median of 5; minor page faults per call.
Measured at debfec3 (loss_bench.txt). Since the next commits every soft_label_weight > 0 trains through the
projected path (the hard-label share folded into its target), so at later commits both rows run it; check
out debfec3 to reproduce the comparison.
"""

import resource
import statistics
import time

import torch

from headway.heads.medusa import MedusaHeads, MedusaHeadsConfig
from headway.heads.medusa_loss import medusa_loss


def make(h=576, vocab=49152, draft=8192):
    torch.manual_seed(0)
    cfg = MedusaHeadsConfig(hidden_size=h, vocab_size=vocab, num_heads=4, num_layers=1, draft_vocab_size=draft)
    heads = MedusaHeads(cfg, token_map=torch.arange(draft, dtype=torch.int64))
    with torch.no_grad():
        for p in heads.parameters():
            p.normal_(0, 0.02)
    return heads, torch.randn(draft, h) * 0.05


def run(heads, rows, hidden, ids, mask, s):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = medusa_loss(heads, hidden, ids, mask, 0.8, teacher_rows=rows, soft_label_weight=s)
    out.loss.backward()
    heads.zero_grad(set_to_none=True)


def main():
    heads, rows = make()
    for B, T, gen in [(8, 320, 200), (8, 1024, 768)]:
        hidden = torch.randn(B, T, 576).bfloat16()  # the feature cache keeps bf16
        ids = torch.randint(0, 8192, (B, T))
        mask = torch.zeros(B, T, dtype=torch.long)
        mask[:, T - gen :] = 1
        times = {"autograd": [], "projected": []}
        faults = {"autograd": [], "projected": []}
        for i in range(7):
            for name, s in (("autograd", 1 - 1e-6), ("projected", 1.0)):
                f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                t0 = time.perf_counter()
                run(heads, rows, hidden, ids, mask, s)
                if i >= 2:
                    times[name].append(time.perf_counter() - t0)
                    faults[name].append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
        a, p = statistics.median(times["autograd"]), statistics.median(times["projected"])
        print(f"batch {B} x {T} tokens, {B * gen} generated: autograd {a * 1000:.0f} ms "
              f"({statistics.median(faults['autograd']):.0f} faults), projected {p * 1000:.0f} ms "
              f"({statistics.median(faults['projected']):.0f} faults): {a / p:.2f}x")  # fmt: skip
    print(f"threads {torch.get_num_threads()}, peak rss {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6:.2f} GB")


if __name__ == "__main__":
    main()
