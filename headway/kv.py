"""The one module that reaches into a transformers KV cache: crop it, keep a path in it, drop rows.

    crop(cache, 12)            # back to the first 12 slots (drop a verified tree, a draft's nodes)
    keep_path(cache, 12, path) # per row, slots 12 + path[b, j] -> 12 + j, then crop to 12 + L
    select_rows(cache, keep)   # finished rows leave the batch

`crop` and `select_rows` use the public `Cache` API. `keep_path` has none to use: it gathers each
layer's `keys` / `values` [B, H, S, D] directly (transformers 5.x `DynamicLayer`), so a change in
transformers' cache layout is fixed here alone.
"""

from __future__ import annotations

import torch
from transformers import Cache


def crop(cache: Cache, length: int) -> None:
    """Keep the first `length` slots of every layer (a no-op when the cache is no longer)."""
    extra = cache.get_seq_length() - length
    if extra > 0:  # a negative count removes that many slots in every 4.x / 5.x signature of crop
        cache.crop(-extra)


def keep_path(cache: Cache, start: int, path: torch.Tensor) -> None:
    """Keep only the accepted path's KV: per row b, slots start + path[b, j] move to start + j
    (j < L = path.shape[1]), and every slot from start + L on is dropped."""
    L = path.shape[1]
    for layer in cache.layers:
        if layer.keys is None:  # a layer the forward has not reached yet
            continue
        B, H, _, D = layer.keys.shape
        idx = (start + path)[:, None, :, None].expand(B, H, L, D)
        for name in ("keys", "values"):
            t = getattr(layer, name)
            t[:, :, start : start + L] = t.gather(2, idx)
            setattr(layer, name, t[:, :, : start + L])


def select_rows(cache: Cache, keep: torch.Tensor) -> None:
    """Keep only these batch rows (indices into the current batch)."""
    cache.batch_select_indices(keep)
