"""One decode step at equal lengths: HF forward (DynamicCache, SDPA) against the generator's `_feed`
(SlotCache, rows attended in groups). Session six, model-167 machine: batch 64, 200 tokens, groups of 8:
HF 103-104 ms, ours 116-118; groups of 16: 106; one group of 64: 100.

    python docs/results/2026-12-02-smollm2/decode_step_vs_hf.py 64 200 8     # batch, context, rows per group
"""
import sys
import time

import torch
from transformers import AutoModelForCausalLM, DynamicCache

from headway.data.generate import Generator, _Row
from headway.kv import SlotCache, decode_attention

B, L, gr = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
P = "/root/.cache/headway/targets/SmolLM2-135M-Instruct"
model = AutoModelForCausalLM.from_pretrained(P, dtype=torch.bfloat16, attn_implementation="sdpa").eval()
ids = torch.randint(100, 40000, (B, L))
def hf():
    with torch.inference_mode():
        c = DynamicCache()
        out = model(input_ids=ids, cache=c, use_cache=True)
        nxt = out.logits[:, -1].argmax(-1, keepdim=True)
        ts = []
        for s in range(12):
            t = time.perf_counter()
            pos = torch.full((B, 1), L + s)
            out = model(input_ids=nxt, cache=c, position_ids=pos, use_cache=True, logits_to_keep=1)
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)
            ts.append(time.perf_counter() - t)
    return sorted(ts)[len(ts)//2]
def ours():
    g = Generator(model, B, 100, {2})
    with torch.inference_mode():
        rows = [_Row(None, ids[i].tolist(), None) for i in range(B)]
        cache = SlotCache(B, 0, group_rows=gr)
        with decode_attention(model) as cache.grouped:
            logits = g._feed(cache, rows, list(range(B)))
            for r, t in zip(rows, logits.argmax(-1).tolist(), strict=True):
                r.pending = [t]
            ts = []
            for _ in range(12):
                t = time.perf_counter()
                logits = g._feed(cache, rows, None)
                for r, tk in zip(rows, logits.argmax(-1).tolist(), strict=True):
                    r.pending = [tk]
                ts.append(time.perf_counter() - t)
    return sorted(ts)[len(ts)//2]
for _ in range(2):
    print(f"B={B} L={L} group_rows={gr}: hf {hf()*1e3:.1f} ms  ours {ours()*1e3:.1f} ms", flush=True)
