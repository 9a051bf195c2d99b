"""One bf16 linear on this CPU: `F.linear` (oneDNN reorders the weight on every call) against the same
weight pre-packed once (headway/packed.py), at SmolLM2-135M's shapes and the row counts of decoding
(1, 8, 25), of the data generator's decode steps (128, 256) and of its prefills (2,048). Median of
interleaved calls; "same" says whether the two results are equal to the bit.

    python docs/results/2026-12-06-smollm2/packed-weights/linear_bench.py
"""

import statistics
import time

import torch

from headway.packed import PACK_ROWS

torch.set_num_threads(2)
op = torch.ops.mkldnn._linear_pointwise
print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, packed for {PACK_ROWS} rows")
print("| out x in | rows | F.linear ms | packed ms | ratio | same |")
print("|---|---|---|---|---|---|")
for n_out, n_in in [(49152, 576), (8192, 576), (1536, 576), (576, 1536), (576, 576), (192, 576)]:
    w = torch.randn(n_out, n_in, dtype=torch.bfloat16)
    wp = torch.ops.mkldnn._reorder_linear_weight(w, PACK_ROWS)
    for rows in (1, 8, 25, 128, 256, 2048):
        x = torch.randn(rows, n_in, dtype=torch.bfloat16)
        reps = 10 if rows * n_out > 10_000_000 else 40
        a, b = [], []
        for _ in range(reps):
            t = time.perf_counter()
            y0 = torch.nn.functional.linear(x, w)
            a.append(time.perf_counter() - t)
            t = time.perf_counter()
            y1 = op(x, wp, None, "none", [], "")
            b.append(time.perf_counter() - t)
        ma, mb = statistics.median(a) * 1e3, statistics.median(b) * 1e3
        print(f"| {n_out} x {n_in} | {rows} | {ma:.3f} | {mb:.3f} | {ma / mb:.2f}x | {torch.equal(y0, y1)} |")
