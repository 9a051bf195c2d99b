"""Where our data generator's time goes: torch.profiler's operator table, grouped by input shape.

    python docs/results/2026-12-06-smollm2/avx2/generator/profile_generator.py 128 128 48   # batch, prompts, new tokens

The prompts are 128 of the default mix's file and passage sources from offset 1000 (18,055 prompt tokens
at batch 128), greedy. Prints the prompt tokens, the generated tokens and seconds (slowed by the profiler),
and the top operators by self CPU time. Run it alone.
"""

import sys
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
prompts = benchmark_prompts(cfg.data, tok)
generate_batch(model, prompts[:2], 4, eos)  # warm-up
bs, n, new = (int(x) for x in sys.argv[1:4])
batch = prompts[1000 : 1000 + n]
print("prompt tokens", sum(map(len, batch)))
with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof, torch.inference_mode():
    t = time.perf_counter()
    answers = generate_batch(model, batch, new, eos, batch_size=bs)
    dt = time.perf_counter() - t
print(sum(len(a.tokens) for a in answers), "tokens", f"{dt:.1f} s")
print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
print(prof.key_averages(group_by_input_shape=True).table(sort_by="self_cpu_time_total", row_limit=40))
