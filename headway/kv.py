"""The one module that reaches into a transformers KV cache: crop it, keep a path in it, drop rows,
and the preallocated per-row window continuous batching writes into.

    crop(cache, 12)            # back to the first 12 slots (drop a verified tree, a draft's nodes)
    keep_path(cache, 12, path) # per row, slots 12 + path[b, j] -> 12 + j, then crop to 12 + L
    select_rows(cache, keep)   # finished rows leave the batch
    cache = SlotCache(rows=64, capacity=0)   # a `Cache` whose rows grow on their own (headway.data.generate)
    with decode_attention(model): ...        # single-query forwards attend with two bmm, no SDPA kernel

`crop` and `select_rows` use the public `Cache` API. `keep_path` has none to use: it gathers each
layer's `keys` / `values` [B, H, S, D] directly (transformers 5.x `DynamicLayer`), so a change in
transformers' cache layout is fixed here alone. `SlotCache` is a `Cache` with its own layer class
(`CacheLayerMixin`: `update` returns the keys and values attention reads).
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from transformers import Cache
from transformers.cache_utils import CacheLayerMixin


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


# ---------------------------------------------------------------- a preallocated window of per-row slots


CAPACITY_STEP = 64  # slots a SlotCache grows or shrinks by
SLOT_ATTENTION = "headway_slot_decode"  # the attention function `decode_attention` switches a model to


class SlotCache(Cache):
    """A preallocated KV window of `rows` sequences that each grow on their own (continuous batching).

        cache = SlotCache(rows=32, capacity=0)
        cache.plan(rows, starts, n)   # this forward: rows [R] (None: all, in order), each writes n slots from starts [R]
        model.get_decoder()(input_ids=ids, attention_mask=mask, position_ids=pos, cache=cache)
        cache.select(keep)            # keep only these rows (their order becomes the new row order)

    Row r holds its sequence in slots 0..len_r - 1; a forward writes each row's new keys and values at
    slots starts[r] + j in place (index_copy_, no concatenation). A forward over every row (a decode
    step) attends over the whole buffers, kept contiguous and at most CAPACITY_STEP slots wider than
    the longest row (they grow and shrink by that step, a copy each time); a forward over some rows (a
    prefill) gathers their slots 0..window - 1, window = max(starts + n). Which slots a row may see is
    the caller's additive mask: the cache keeps no lengths. Rows that write fewer than n real tokens
    (right padding) leave garbage past their length, masked out and overwritten by their next tokens.
    """

    def __init__(self, rows: int, capacity: int):
        super().__init__(layers=None, layer_class_to_replicate=lambda: _SlotLayer(self))
        self.num_rows, self.capacity = rows, capacity
        self.rows: torch.Tensor | None = None
        self.slots = torch.zeros(rows, 1, dtype=torch.long)
        self.window = 0
        self._flat: tuple | None = None  # (heads, capacity) -> flat write index of this forward

    def plan(self, rows: torch.Tensor | None, starts: torch.Tensor, n: int) -> int:
        """Where the next forward writes: rows (None: every row, in order) each n slots from starts[r].

        Returns the key length the forward attends over (its mask's last dimension): every slot of the
        buffer when rows is None (whole contiguous buffers, nothing copied), else slots 0..window - 1
        of the rows named (gathered: a copy).
        """
        self.rows = rows
        self.slots = starts[:, None] + torch.arange(n, device=starts.device)
        self.window = int(self.slots[:, -1].max()) + 1
        self._flat = None
        # Capacity follows the window in CAPACITY_STEP steps, so a decode step attends over at most
        # that many slots more than its longest row needs; shrink only after a decode step.
        fit = -(-self.window // CAPACITY_STEP) * CAPACITY_STEP
        if fit > self.capacity or (rows is None and self.capacity - fit >= 2 * CAPACITY_STEP):
            self.capacity = fit
            for layer in self.layers:
                layer.resize(fit)
        return self.capacity if rows is None else self.window

    def flat_index(self, heads: int) -> torch.Tensor:
        """Where this forward's [R, heads, n] new entries go in a layer's [rows * heads * capacity] slots."""
        key = (heads, self.capacity)
        if self._flat is None or self._flat[0] != key:
            rows = torch.arange(self.num_rows) if self.rows is None else self.rows
            rows = rows.to(self.slots.device)
            head = torch.arange(heads, device=self.slots.device)
            flat = (rows[:, None, None] * heads + head[None, :, None]) * self.capacity + self.slots[:, None, :]
            self._flat = (key, flat.reshape(-1))
        return self._flat[1]

    def select(self, keep: torch.Tensor) -> None:
        """Keep only rows `keep` (indices into the current rows), in that order."""
        self.num_rows = keep.numel()
        for layer in self.layers:
            layer.batch_select_indices(keep)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.window


class _SlotLayer(CacheLayerMixin):
    is_sliding = False

    def __init__(self, owner: SlotCache):
        super().__init__()
        self.owner = owner

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        _, H, _, D = key_states.shape
        o = self.owner
        self.keys = key_states.new_zeros(o.num_rows, H, o.capacity, D)
        self.values = value_states.new_zeros(o.num_rows, H, o.capacity, value_states.shape[-1])
        self.device, self.is_initialized = key_states.device, True

    def resize(self, capacity: int) -> None:
        if not self.is_initialized:
            return
        for name in ("keys", "values"):
            old = getattr(self, name)
            new = old.new_zeros(*old.shape[:2], capacity, old.shape[-1])
            keep = min(capacity, old.shape[2])
            new[:, :, :keep] = old[:, :, :keep]
            setattr(self, name, new)

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        o = self.owner
        idx = o.flat_index(self.keys.shape[1])
        # One index_copy_ per tensor into its [rows * heads * slots, D] view: advanced-index assignment
        # (keys[rows, :, slots] = ...) measured ~50x slower on CPU for a decode step's few rows.
        for buf, new in ((self.keys, key_states), (self.values, value_states)):
            buf.view(-1, buf.shape[-1]).index_copy_(0, idx, new.reshape(-1, new.shape[-1]))
        if o.rows is None:
            return self.keys, self.values  # the whole (contiguous) buffers: nothing copied
        return self.keys[o.rows, :, : o.window], self.values[o.rows, :, : o.window]

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.is_initialized:
            self.keys, self.values = self.keys[indices], self.values[indices]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.owner.window, 0

    def get_seq_length(self) -> int:
        return self.owner.window

    def get_max_length(self) -> int:
        return self.owner.capacity


# ---------------------------------------------------------------- decode attention over whole slot buffers


def _slot_decode_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """One query per row over contiguous [B, Hkv, S, D] keys: two batched matmuls, the query heads of a
    key head packed together (no repeat_kv copy). Measured on this CPU (bf16, batch 32, 600 slots)
    3-4x faster than torch's SDPA kernel for this shape. Scores are computed in the model dtype and
    the softmax in fp32, as transformers' eager attention does. Anything else goes to SDPA."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    special = any(kwargs.get(k) is not None for k in ("softcap", "sliding_window", "s_aux", "position_bias"))
    if query.shape[2] != 1 or special or not key.is_contiguous() or not value.is_contiguous():
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    B, Hq, _, D = query.shape
    Hk, S = key.shape[1], key.shape[2]
    q = query.reshape(B * Hk, Hq // Hk, D)
    scores = torch.bmm(q, key.view(B * Hk, S, D).transpose(1, 2)).view(B, Hk, Hq // Hk, S)
    scores = scores * (scaling if scaling is not None else D**-0.5)
    if attention_mask is not None:
        scores = scores + attention_mask  # [B, 1, 1, S] broadcasts over heads
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(value.dtype)
    out = torch.bmm(probs.view(B * Hk, Hq // Hk, S), value.view(B * Hk, S, value.shape[-1]))
    return out.view(B, 1, Hq, value.shape[-1]), None  # [B, q, heads, D], as transformers' kernels return


@contextmanager
def decode_attention(model):
    """Within the block, the model's SDPA/eager attention runs `_slot_decode_attention` (single-query
    forwards; the rest still SDPA). Switched on the shared config, and always switched back."""
    from transformers import AttentionInterface

    config = getattr(model, "config", None)
    old = getattr(config, "_attn_implementation", None)
    if old not in ("sdpa", "eager"):
        yield
        return
    AttentionInterface.register(SLOT_ATTENTION, _slot_decode_attention)
    config._attn_implementation_internal = SLOT_ATTENTION
    try:
        yield
    finally:
        config._attn_implementation_internal = old
