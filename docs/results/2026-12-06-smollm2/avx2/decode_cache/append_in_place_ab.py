"""Plain decoding through transformers' DynamicCache (torch.cat of the whole cache per step) against a
cache whose layers append in place into spare capacity; tried in session twenty-seven, not adopted.

    python docs/results/2026-12-06-smollm2/avx2/decode_cache/append_in_place_ab.py 300 800 1500   # cached tokens

Per context length: a random prompt of that many tokens is prefilled, then 24 greedy one-token steps are
timed; three rounds, the two caches alternating within each; prints the best ms per step of each and
whether the last step's logits are equal to the bit. Run it alone.
"""

import sys
import time

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from headway.config import TargetConfig
from headway.target import load_target

STEP = 256  # spare slots a layer grows by


class AppendInPlaceLayer(DynamicLayer):
    """keys / values are views of a buffer with spare slots: appending writes into it, no torch.cat."""

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.keys = self._append("_kbuf", self.keys, key_states)
        self.values = self._append("_vbuf", self.values, value_states)
        return self.keys, self.values

    def _append(self, name, cur, new):
        n, k = (cur.shape[-2] if cur.dim() == 4 else 0), new.shape[-2]
        buf = getattr(self, name, None)
        fits = buf is not None and cur.dim() == 4 and cur.data_ptr() == buf.data_ptr() and n + k <= buf.shape[-2]
        if not fits:
            buf = new.new_empty(*new.shape[:2], -(-(n + k + STEP) // STEP) * STEP, new.shape[-1])
            if n:
                buf[:, :, :n].copy_(cur)
            setattr(self, name, buf)
        buf[:, :, n : n + k].copy_(new)
        return buf[:, :, : n + k]


def append_in_place_cache(config):
    cache = DynamicCache(config=config)
    cache.layer_class_to_replicate = AppendInPlaceLayer
    cache.layers = [AppendInPlaceLayer() for _ in cache.layers]
    return cache


model, _ = load_target(TargetConfig())
torch.manual_seed(0)


def decode(make, ids, steps=24):
    cache = make()
    out = model(ids, past_key_values=cache, use_cache=True)
    nxt = out.logits[:, -1:].argmax(-1)
    t = time.perf_counter()
    for _ in range(steps):
        out = model(nxt, past_key_values=cache, use_cache=True)
        nxt = out.logits[:, -1:].argmax(-1)
    return (time.perf_counter() - t) / steps * 1000, out.logits


arms = {"DynamicCache": lambda: DynamicCache(config=model.config), "append in place": lambda: append_in_place_cache(model.config)}
with torch.inference_mode():
    for ctx in (int(x) for x in sys.argv[1:]):
        ids = torch.randint(100, 40000, (1, ctx))
        best, logits = {}, {}
        for _ in range(3):
            for name, make in arms.items():
                ms, logits[name] = decode(make, ids)
                best[name] = min(best.get(name, ms), ms)
        same = torch.equal(*logits.values())
        print(f"{ctx} cached tokens: " + ", ".join(f"{k} {v:.1f} ms" for k, v in best.items()) + f"; logits equal: {same}", flush=True)
