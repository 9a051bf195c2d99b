"""Where the Zen 4's generator spends a decode step: 128 mix prompts, batch 128, 48 new tokens, profiled."""

import time

import torch
from torch.profiler import ProfilerActivity, profile

from headway.config import load_config
from headway.data.generate import generate_batch
from headway.data.sources import benchmark_prompts
from headway.target import load_target, stop_token_ids

cfg = load_config("configs/smollm2-135m/data.yaml")
model, tok = load_target(cfg.target)
eos = stop_token_ids(model, tok)
prompts = benchmark_prompts(cfg.data, tok)[:128]
generate_batch(model, prompts[:2], 4, eos)
with torch.inference_mode():
    generate_batch(model, prompts, 16, eos, batch_size=128)  # prefill + warm
with profile(activities=[ProfilerActivity.CPU]) as prof, torch.inference_mode():
    t = time.perf_counter()
    generate_batch(model, prompts, 48, eos, batch_size=128)
    print("wall", time.perf_counter() - t)
print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
