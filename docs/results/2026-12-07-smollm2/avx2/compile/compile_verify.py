"""Would torch.compile make the engine's own target forward cheaper? (feasibility only)

    python docs/results/2026-12-07-smollm2/avx2/compile/compile_verify.py [steps]   # alone; compiles for minutes

The forward as inference/engine.py runs it: the decoder (no lm_head) over k new tokens with a 4-D float
mask, explicit position ids and a transformers DynamicCache, then the cache cropped back (as after a
rejected tree). The cache starts at 300 tokens of random ids and grows by one kept token per step, so
shapes change every step, as they do in decoding. k = 1 (plain decoding) and k = 5 (the quickstart's
Medusa tree plus its root). Arms, interleaved in rounds: headway's eager load (oneDNN-packed linears)
against torch.compile(dynamic=True) of the decoder's forward on plain weights (inductor, freezing).
Their hidden states at the first step are compared.
"""
import statistics
import sys
import time

import torch
from compile_decode import timed  # the script's own folder is on sys.path
from transformers import DynamicCache

from headway.config import TargetConfig
from headway.inference.layout import additive_mask
from headway.kv import cache_kwarg
from headway.target import load_target

CTX = 300


def float_mask(k: int, past: int, dtype) -> torch.Tensor:
    """[1, 1, k, past + k]: every cached token, and the new ones causally (as inference/cost.py builds it)."""
    allowed = torch.ones(k, past + k, dtype=torch.bool)
    allowed[:, past:] = torch.ones(k, k, dtype=torch.bool).tril()
    return additive_mask(allowed, dtype)[None, None]


class Arm:
    def __init__(self, decoder, prefix):
        self.decoder, self.cache = decoder, DynamicCache(config=decoder.config)
        self.call(prefix)

    def call(self, ids):
        past = self.cache.get_seq_length()
        k = ids.shape[1]
        pos = torch.arange(past, past + k)[None]
        return self.decoder(input_ids=ids, attention_mask=float_mask(k, past, torch.float32), position_ids=pos,
                            use_cache=True, **cache_kwarg(self.decoder, self.cache)).last_hidden_state

    def step(self, k: int):
        """k new tokens, then keep one of them (an accepted root), as a speculative step does."""
        out = self.call(torch.randint(100, 4000, (1, k)))
        if k > 1:
            self.cache.crop(-(k - 1))  # this transformers crops by a negative count only
        return out


@torch.inference_mode()
def main() -> None:
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    torch.manual_seed(0)
    prefix = torch.randint(100, 40000, (1, CTX))
    packed, _ = load_target(TargetConfig())
    plain, _ = load_target(TargetConfig(pack_weights=False))
    torch._inductor.config.freezing = True
    compiled_decoder = plain.get_decoder()
    compiled_decoder.forward = torch.compile(compiled_decoder.forward, dynamic=True)
    arms = {"eager-packed": Arm(packed.get_decoder(), prefix), "compiled": Arm(compiled_decoder, prefix)}

    probe = torch.randint(100, 4000, (1, 5))
    t = time.perf_counter()
    first = {name: arm.call(probe) for name, arm in arms.items()}
    print(f"first step, the compile included: {time.perf_counter() - t:.0f} s")
    print(f"max |hidden - eager-packed's| at the first step: {float((first['compiled'] - first['eager-packed']).abs().max()):.2e}")
    for arm in arms.values():
        arm.cache.crop(-5)
    for k in (1, 5):
        t = time.perf_counter()
        for arm in arms.values():
            timed(lambda arm=arm, k=k: arm.step(k), 3)  # warm-up: a dynamic-shape recompile happens here
        print(f"k={k} warm-up: {time.perf_counter() - t:.0f} s")
    for k in (1, 5):
        ms = {name: [] for name in arms}
        for _ in range(5):
            for name, arm in arms.items():
                ms[name].append(timed(lambda arm=arm, k=k: arm.step(k), steps))
        for name, v in ms.items():
            print(f"k={k} {name}: {statistics.median(v):.1f} ms per forward (rounds: {', '.join(f'{x:.1f}' for x in v)})")


if __name__ == "__main__":
    main()
