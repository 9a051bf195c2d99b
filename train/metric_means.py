"""Batch metrics summed into means over what they count, for the training log and for validation.

A head reports each metric as a batch's mean (`head1/top1` is hits / positions in that batch). Summing
those over batches and dividing by the number of batches would let a short batch count as much as a full
one, so each batch's mean is weighted by the count it is over (`count_key`: `head{k}/positions`,
`pairs_step{i}`, `target/positions`, ...); a metric with no count (the loss, the counts themselves) is
a mean per batch. Summed over ranks before dividing, the figure is the one over every rank's positions.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from headway.heads.base import count_key


class WeightedMeans:
    """Running sums of count-weighted batch means, and their weights, per metric."""

    def __init__(self) -> None:
        self.sums: dict[str, torch.Tensor] = {}
        self.weights: dict[str, torch.Tensor | float] = {}

    def add(self, metrics: dict[str, torch.Tensor], scale: float = 1.0) -> None:
        """One batch's metrics; `scale` 0 runs a batch that counts for nothing (an empty rank's share)."""
        out = {k: v.detach().float() for k, v in metrics.items()}
        for k, v in out.items():
            count = count_key(k)
            w = out[count] * scale if count in out else scale  # no count: every batch weighs the same
            self.sums[k] = self.sums.get(k, 0.0) + v * w
            self.weights[k] = self.weights.get(k, 0.0) + w

    def means(self, reduce_sum: Callable[[dict], dict]) -> dict[str, float]:
        """The means over every batch added, on every rank: `reduce_sum(dict) -> dict of floats` sums
        a dict of scalars over ranks (one collective for all)."""
        packed = {**{("sum", k): v for k, v in self.sums.items()}, **{("weight", k): v for k, v in self.weights.items()}}
        totals = reduce_sum(packed)
        return {k: totals["sum", k] / max(totals["weight", k], 1e-12) for k in self.sums}
