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
with profile(activities=[ProfilerActivity.CPU], with_stack=True, record_shapes=True) as prof, torch.inference_mode():
    generate_batch(model, prompts, 24, eos, batch_size=128)
ka = prof.key_averages(group_by_input_shape=True)
rows = sorted([e for e in ka if e.key in ("aten::fill_", "aten::copy_", "aten::mul")], key=lambda e: -e.self_cpu_time_total)[:8]
for e in rows:
    print(f"{e.key} self {e.self_cpu_time_total/1e3:.0f} ms calls {e.count}")
    print("     shapes", e.input_shapes)
