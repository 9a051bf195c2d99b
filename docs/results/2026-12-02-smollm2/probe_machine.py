"""Decode-step speed of the target in bf16 and fp32, batch 1 and 64, and one GEMM of the MLP's shape.

    python docs/results/2026-12-02-smollm2/probe_machine.py

A one-minute look at what a machine favours, run alone: on the third 2-core machine of 2026-12-02 fp32
beat bf16 at batch 1 and in the GEMM, bf16 won at batch 64 (see third_machine.txt).
"""

import time

import torch

from headway.config import TargetConfig
from headway.target import load_target

for dtype in ["bfloat16", "float32"]:
    model, tok = load_target(TargetConfig(name="smollm2-135m-instruct", dtype=dtype))
    for batch in [1, 64]:
        with torch.inference_mode():
            cache = model(torch.randint(0, 1000, (batch, 200)), use_cache=True).past_key_values
            nxt = torch.randint(0, 1000, (batch, 1))
            times = []
            for _ in range(6):
                t = time.perf_counter()
                model(nxt, past_key_values=cache, use_cache=True)
                times.append(time.perf_counter() - t)
        best = min(times[1:])
        print(f"{dtype} batch {batch}: decode step {1000 * best:.1f} ms, {batch / best:.1f} tokens/s (200 tokens of context)")
    a = torch.randn(64, 576, dtype=getattr(torch, dtype))
    w = torch.randn(1536, 576, dtype=getattr(torch, dtype))
    for _ in range(3):
        a @ w.T
    t = time.perf_counter()
    for _ in range(200):
        a @ w.T
    print(f"{dtype} GEMM 64x576 @ 576x1536: {(time.perf_counter() - t) / 200 * 1e6:.0f} us")
