"""The packed target lm_head (49,152 x 576, bf16) per call over 1-33 rows, alone and followed by the
engine's fp32 argmax: what one more call costs against one more row (inference/engine.py LEAF_CALL_ROWS).

    python docs/results/2026-12-06-smollm2/gqa-sdpa/lm_head_bench.py
"""

import torch

from headway.bench import per_call_us
from headway.config import load_config
from headway.inference.engine import argmax
from headway.target import load_target


def bench(f, n=60):  # milliseconds
    return per_call_us(f, n, warmup=5) / 1000


model, _ = load_target(load_config("configs/smollm2-135m/eagle3.yaml", []).target)
head = model.lm_head
with torch.inference_mode():
    for rows in (1, 2, 5, 8, 9, 12, 13, 15, 16, 17, 18, 20, 24, 33):
        x = torch.randn(1, rows, 576, dtype=torch.bfloat16)
        print(rows, f"lm_head {bench(lambda x=x: head(x)):.2f} ms", f"with argmax {bench(lambda x=x: argmax(head(x))):.2f} ms")
