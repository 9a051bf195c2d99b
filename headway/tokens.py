"""Token-list helpers shared by the generation loops, the engine and the benchmarks."""

from __future__ import annotations

from collections.abc import Collection, Sequence

import torch


def left_pad(rows: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token lists -> ids [B, T] long, left-padded with pad_id, and valid [B, T] bool (True on real
    tokens), on the CPU. Left padding keeps every row's last token in the last column."""
    if not rows:
        raise ValueError("left_pad: no rows to pad")
    T = max(len(r) for r in rows)
    ids = torch.tensor([[pad_id] * (T - len(r)) + list(r) for r in rows], dtype=torch.long)
    valid = torch.tensor([[False] * (T - len(r)) + [True] * len(r) for r in rows], dtype=torch.bool)
    return ids, valid


def cut_at_eos(tokens: Sequence[int], eos_ids: Collection[int]) -> list[int]:
    """The tokens up to and including the first EOS; all of them when there is none."""
    for i, t in enumerate(tokens):
        if t in eos_ids:
            return list(tokens[: i + 1])
    return list(tokens)
