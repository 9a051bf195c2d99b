"""HF prefill tokens/s by tokens per forward (rows x L). Session six, model-167 machine, L=256:
2,100-2,700 at 256 tokens, 4,100 at 1,024, 4,300-4,700 at 2,048, 3,600-3,800 at 4,096.

    python docs/results/2026-12-02-smollm2/prefill_chunks.py 256
"""
import sys
import time

import torch
from transformers import AutoModelForCausalLM

P = "/root/.cache/headway/targets/SmolLM2-135M-Instruct"
model = AutoModelForCausalLM.from_pretrained(P, dtype=torch.bfloat16, attn_implementation="sdpa").eval()
dec = model.get_decoder()
L = int(sys.argv[1]) if len(sys.argv) > 1 else 256
with torch.inference_mode():
    for _rep in range(2):
        for tokens in (256, 512, 1024, 2048, 4096):
            R = max(1, tokens // L)
            ids = torch.randint(100, 40000, (R, L))
            dec(input_ids=ids)
            t = time.perf_counter()
            for _ in range(max(1, 4096 // tokens)):
                dec(input_ids=ids)
            el = (time.perf_counter() - t) / max(1, 4096 // tokens)
            print(f"L={L} rows={R} tokens={R*L}: {R*L/el:.0f} tok/s", flush=True)
