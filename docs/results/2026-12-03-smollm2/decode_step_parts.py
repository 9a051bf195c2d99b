"""What a batched decode step costs, and what feeding more than one token per row would cost: HF forwards
(DynamicCache, SDPA) over B rows of L context tokens feeding n = 1, 2, 4, 8 tokens per row, then the
generator's own decode step (`_feed`, SlotCache, grouped attention) under torch.profiler, by op.

    python docs/results/2026-12-03-smollm2/decode_step_parts.py 128 400     # batch, context tokens

Session eight, model-167 machine, alone (decode_step_parts.txt): our step 247-271 ms; by op, the grouped
attention's bmm 48% (114 ms a step: 1.18 GB of keys and values at about 10 GB/s), mm 18%, index_copy_ 5%,
argmax 4% (bf16 argmax over [128, 49152]: 9.9 ms, in fp32 4.8 ms in a micro-benchmark; taking it in fp32 in
the generator bought nothing in a real run, argmax_ab.txt, and was reverted).
HF's forward over n > 1 new tokens per row with a padded-batch DynamicCache costs 4-8x its one-token
forward (SDPA's masked path), so it says nothing about what verifying drafts in the generator would cost.
"""

import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile
from transformers import AutoModelForCausalLM, DynamicCache

from headway.data.generate import Generator, _Row
from headway.kv import GROUP_ROWS, SlotCache, crop, decode_attention

B, L = int(sys.argv[1]), int(sys.argv[2])
P = "/root/.cache/headway/targets/SmolLM2-135M-Instruct"
model = AutoModelForCausalLM.from_pretrained(P, dtype=torch.bfloat16, attn_implementation="sdpa").eval()
torch.manual_seed(0)
ids = torch.randint(100, 40000, (B, L))


def hf_forwards(ns=(1, 2, 4, 8), reps=5):
    out = {}
    with torch.inference_mode():
        c = DynamicCache()
        for start in range(0, L, 128):  # prefill in chunks (memory)
            model(input_ids=ids[:, start : start + 128], cache=c, use_cache=True, logits_to_keep=1)
        for n in ns:
            new = torch.randint(100, 40000, (B, n))
            pos = torch.arange(L, L + n)[None].expand(B, n)
            ts = []
            for _ in range(reps):
                t = time.perf_counter()
                o = model(input_ids=new, cache=c, position_ids=pos, use_cache=True, logits_to_keep=n)
                o.logits.argmax(-1)
                ts.append(time.perf_counter() - t)
                crop(c, L)
            out[n] = sorted(ts)[len(ts) // 2]
    return out


def ours(steps=6, prof=False):
    g = Generator(model, B, 100, {2})
    with torch.inference_mode():
        rows = [_Row(None, ids[i].tolist(), None) for i in range(B)]
        cache = SlotCache(B, 0, group_rows=GROUP_ROWS)
        with decode_attention(model) as cache.grouped:
            for start in range(0, B, 8):
                idx = list(range(start, min(B, start + 8)))
                logits = g._feed(cache, rows, idx)
                for i, t in zip(idx, logits.argmax(-1).tolist(), strict=True):
                    rows[i].pending = [t]
            ts = []
            p = profile(activities=[ProfilerActivity.CPU]) if prof else None
            if p:
                p.__enter__()
            for _ in range(steps):
                t = time.perf_counter()
                logits = g._feed(cache, rows, None)
                for r, tk in zip(rows, logits.argmax(-1).tolist(), strict=True):
                    r.pending = [tk]
                ts.append(time.perf_counter() - t)
            if p:
                p.__exit__(None, None, None)
                print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=18))
    return sorted(ts)[len(ts) // 2]


for r in range(2):
    hf = hf_forwards()
    print(f"round {r}: B={B} L={L} HF forward by tokens per row: " + ", ".join(f"n={n} {t * 1e3:.1f} ms" for n, t in hf.items()), flush=True)
    print(f"round {r}: ours decode step {ours() * 1e3:.1f} ms", flush=True)
ours(steps=4, prof=True)
