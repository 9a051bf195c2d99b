"""Would torch.compile make the target's one-token decode step cheaper on this CPU? (feasibility only)

    python docs/results/2026-12-07-smollm2/avx2/compile/compile_decode.py [steps]   # alone; compiles for minutes

The target in fp32, 300 cached tokens of random ids, one new token per step, `logits_to_keep=1`:
  eager-packed    headway's load (oneDNN-packed linears), transformers' DynamicCache (the engine's path)
  eager-static    plain nn.Linear weights, a StaticCache
  compiled-static the same model's forward under torch.compile (inductor, freezing: it packs the
                  linears itself), the same StaticCache
With the DynamicCache each step is cropped back to 300 tokens; with the StaticCache each step takes the next
of its 428 slots (attention there reads every slot, masked, so every step does equal work).
The arms run interleaved, in rounds; the median ms per step of each is printed. The greedy next token
of each arm is compared on one real prefix, so a compiled step that computed something else shows.
"""
import statistics
import sys
import time

import torch
from transformers import DynamicCache, StaticCache

from headway.config import TargetConfig
from headway.target import load_target

CTX = 300


def timed(fn, n: int) -> float:
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / n * 1e3


@torch.inference_mode()
def main() -> None:
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    if 1 + 3 + 5 * steps > 128:  # the StaticCache's spare slots: one per step of the compiled and eager-static arms
        raise SystemExit(f"steps={steps}: at most 24 fit the StaticCache's 128 spare slots")
    torch.manual_seed(0)
    prefix = torch.randint(100, 40000, (1, CTX))
    new = torch.tensor([[1234]])

    packed, _ = load_target(TargetConfig())
    plain, _ = load_target(TargetConfig(pack_weights=False))
    print(plain.config._attn_implementation, plain.dtype, torch.get_num_threads(), "threads")

    dyn = DynamicCache(config=packed.config)
    packed(prefix, past_key_values=dyn, use_cache=True)

    def eager_packed():
        out = packed(new, past_key_values=dyn, use_cache=True, logits_to_keep=1)
        dyn.crop(-1)
        return out.logits

    def static_arm(forward):
        cache = StaticCache(config=plain.config, max_cache_len=CTX + 128)
        forward(prefix, past_key_values=cache, use_cache=True)

        def step():  # transformers places the token after the last one cached: one slot further each step
            return forward(new, past_key_values=cache, use_cache=True, logits_to_keep=1).logits

        return step

    eager_static = static_arm(plain)
    torch._inductor.config.freezing = True
    compiled_static = static_arm(torch.compile(plain.forward, dynamic=False))
    arms = {"eager-packed": eager_packed, "eager-static": eager_static, "compiled-static": compiled_static}
    # each arm's first step sees the same 300 tokens plus one: its logits must agree
    t = time.perf_counter()
    first = {name: fn()[0, -1] for name, fn in arms.items()}
    print(f"first steps, the compile included: {time.perf_counter() - t:.0f} s")
    ref = first["eager-packed"]
    for name, logits in first.items():
        print(f"{name}: greedy token {int(logits.argmax())}, max |logit - eager-packed's| {float((logits - ref).abs().max()):.2e}")
    for fn in arms.values():
        timed(fn, 3)
    ms = {name: [] for name in arms}
    for _ in range(5):
        for name, fn in arms.items():
            ms[name].append(timed(fn, steps))
    for name, v in ms.items():
        print(f"{name}: {statistics.median(v):.1f} ms per step (rounds: {', '.join(f'{x:.1f}' for x in v)})")


if __name__ == "__main__":
    main()
