"""Which rows each rank trains on, in which order: deterministic from (seed, epoch), so resume is exact.

    order = DataOrder(lengths, batch_size=8, world_size=2, rank=0, seed=0)
    order.batches(epoch=0)      # this rank's micro-batches (lists of row indices) for epoch 0
    eval_batches(lengths, batch_size=8, world_size=2, rank=0)   # validation: every row once

Every epoch is a fresh permutation. Each global batch (batch_size x world_size rows) is split into
contiguous per-rank slices, so ranks never share a row within an epoch; the last global batch wraps
around to the first rows so every rank runs the same number of steps (as DistributedSampler does).
With `group_by_length`, rows are sorted by length inside windows of 64 global batches before batching
and the batches are then shuffled: far less padding, still a random order.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

LENGTH_WINDOW = 64  # global batches per length-sorting window


class DataOrder:
    def __init__(
        self,
        lengths: Sequence[int],
        batch_size: int,
        world_size: int = 1,
        rank: int = 0,
        seed: int = 0,
        group_by_length: bool = True,
        shuffle: bool = True,
    ) -> None:
        if len(lengths) == 0:
            raise ValueError("the training split is empty")
        if batch_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"bad batch_size={batch_size} / rank={rank} / world_size={world_size}")
        self.lengths = list(lengths)
        self.batch_size = batch_size
        self.world_size = world_size
        self.rank = rank
        self.seed = seed
        self.group_by_length = group_by_length
        self.shuffle = shuffle

    @property
    def global_batch(self) -> int:
        return self.batch_size * self.world_size

    @property
    def batches_per_epoch(self) -> int:
        return math.ceil(len(self.lengths) / self.global_batch)

    def batches(self, epoch: int) -> list[list[int]]:
        n, gb = len(self.lengths), self.global_batch
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        order = torch.randperm(n, generator=g).tolist() if self.shuffle else list(range(n))
        total = self.batches_per_epoch * gb
        order = (order * math.ceil(total / n))[:total]  # wrap around: equal work on every rank
        if self.group_by_length:
            window = gb * LENGTH_WINDOW
            order = [
                i
                for start in range(0, total, window)
                for i in sorted(order[start : start + window], key=lambda j: -self.lengths[j])
            ]
        global_batches = [order[s : s + gb] for s in range(0, total, gb)]
        if self.group_by_length and self.shuffle:
            perm = torch.randperm(len(global_batches), generator=g).tolist()
            global_batches = [global_batches[i] for i in perm]
        lo, hi = self.rank * self.batch_size, (self.rank + 1) * self.batch_size
        return [b[lo:hi] for b in global_batches]


def eval_batches(lengths: Sequence[int], batch_size: int, world_size: int = 1, rank: int = 0) -> list[list[int]]:
    """Validation's batches for one rank (the loop's and head_accuracy's): every row exactly once (no
    wrap-around: a repeated row would count twice in the metrics), longest first for little padding,
    global batches split across ranks as in training. Every rank gets the same number of batches, so
    collectives in a forward stay in step; a rank's share of the last one may be empty (the loop then
    runs a forward that counts for nothing)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    gb, lo, hi = batch_size * world_size, rank * batch_size, (rank + 1) * batch_size
    return [order[s : s + gb][lo:hi] for s in range(0, len(order), gb)]
