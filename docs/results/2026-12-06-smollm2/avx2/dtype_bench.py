"""Which dtype and which linear kernel suit this CPU: SmolLM2-135M's linear shapes in fp32 (MKL's
F.linear, oneDNN packed) and bf16 (F.linear), then the whole target decoding one token and verifying
17 (a 16-node tree) over 300 cached tokens, arms interleaved. Prints the CPU's oneDNN bf16 support.

    python docs/results/2026-12-06-smollm2/avx2/dtype_bench.py          # kernels and the model
    python docs/results/2026-12-06-smollm2/avx2/dtype_bench.py kernels  # kernels only
"""

import sys
import time

import torch
import torch.nn.functional as F

from headway.bench import per_call_us
from headway.config import TargetConfig
from headway.kv import crop
from headway.packed import PACK_ROWS, cpu_has_bf16_kernels
from headway.target import load_target


def bench(f, n):
    return per_call_us(f, n, warmup=3)


def kernels():
    print("| out x in | rows | fp32 F.linear (MKL) us | fp32 oneDNN packed us | bf16 F.linear us |")
    print("|---|---|---|---|---|")
    for out_f, in_f in ((1536, 576), (576, 1536), (49152, 576)):
        w = torch.randn(out_f, in_f) * 0.05
        packed = torch.ops.mkldnn._reorder_linear_weight(w, PACK_ROWS)
        wb = w.bfloat16()
        for rows in (1, 17, 64):
            x = torch.randn(rows, in_f)
            xb = x.bfloat16()
            n = 100 if out_f < 10_000 else 10
            mkl = bench(lambda x=x, w=w: F.linear(x, w), n)
            onednn = bench(lambda x=x, p=packed: torch.ops.mkldnn._linear_pointwise(x, p, None, "none", [], ""), n)
            bf16 = bench(lambda x=xb, w=wb: F.linear(x, w), max(2, n // 5))
            print(f"| {out_f} x {in_f} | {rows} | {mkl:.0f} | {onednn:.0f} | {bf16:.0f} |", flush=True)


def model(reps=3, context=300, tree=17):
    arms = {"fp32 packed": (torch.float32, True), "fp32 MKL": (torch.float32, False)}
    arms["bf16" + (" packed" if cpu_has_bf16_kernels() else "")] = (torch.bfloat16, True)
    models = {k: load_target(TargetConfig(pack_weights=p), dtype=dt)[0] for k, (dt, p) in arms.items()}
    ids = torch.randint(100, 20_000, (1, context + tree))
    totals = {k: [0.0, 0.0] for k in models}
    for _ in range(reps):
        for k, m in models.items():  # interleaved: every arm once per round
            with torch.inference_mode():
                cache = m(ids[:, :context], use_cache=True).past_key_values
                t = time.perf_counter()
                for i in range(10):
                    m(ids[:, context + i : context + i + 1], past_key_values=cache, use_cache=True)
                totals[k][0] += (time.perf_counter() - t) / 10
                crop(cache, context)
                t = time.perf_counter()
                for _ in range(3):
                    m(ids[:, context:], past_key_values=cache, use_cache=True)
                    crop(cache, context)
                totals[k][1] += (time.perf_counter() - t) / 3
    print(f"\n| SmolLM2-135M, {context} cached tokens | decode 1 token ms | verify {tree} tokens ms | verify / decode |")
    print("|---|---|---|---|")
    for k, (one, many) in totals.items():
        print(f"| {k} | {1e3 * one / reps:.1f} | {1e3 * many / reps:.1f} | {many / one:.2f} |")


if __name__ == "__main__":
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, CPU capability {torch.backends.cpu.get_cpu_capability()}, "
          f"oneDNN bf16 kernels: {cpu_has_bf16_kernels()}, threads {torch.get_num_threads()}\n")
    kernels()
    if sys.argv[1:] != ["kernels"]:
        model()
