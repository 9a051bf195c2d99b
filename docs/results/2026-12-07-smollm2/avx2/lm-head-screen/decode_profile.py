"""Where a one-token decode step of the transformers target goes on this CPU (output in decode_profile.txt).

    python docs/results/2026-12-07-smollm2/avx2/lm-head-screen/decode_profile.py   # under a minute, alone

The target as headway loads it (fp32 packed linears here), 300 cached tokens of random ids, the
transformers DynamicCache cropped back after each step; 20 timed steps of 1 and of 5 new tokens, then a
profile of 10 one-token steps.
"""
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile
from transformers import DynamicCache

sys.path.insert(0, str(Path(__file__).resolve().parents[5]))
from headway.config import TargetConfig  # noqa: E402
from headway.target import load_target  # noqa: E402


@torch.inference_mode()
def main() -> None:
    model, _ = load_target(TargetConfig())
    print(model.config._attn_implementation, model.dtype, torch.get_num_threads(), "threads")
    torch.manual_seed(0)
    cache = DynamicCache(config=model.config)
    model(torch.randint(100, 40000, (1, 300)), past_key_values=cache, use_cache=True)

    def step(n: int = 1) -> None:
        model(torch.randint(100, 4000, (1, n)), past_key_values=cache, use_cache=True, logits_to_keep=1)
        cache.crop(-n)

    for n in (1, 5):
        for _ in range(3):
            step(n)
        t = time.perf_counter()
        for _ in range(20):
            step(n)
        print(f"{n} new tokens: {(time.perf_counter() - t) / 20 * 1e3:.1f} ms per forward")
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(10):
            step(1)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))


if __name__ == "__main__":
    main()
