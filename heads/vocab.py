"""The draft vocabulary: the V' target tokens a draft head may propose, and the maps to and from target ids.

    vocab = build_draft_vocab(ds["train"], draft_vocab_size=8192, target_vocab_size=49152, always_include=[2])
    target_ids = vocab.to_target(draft_ids)        # = draft_ids + vocab.d2t[draft_ids]
    draft_ids = vocab.to_draft(target_ids)         # -1 where the target token is outside V'

The V' most frequent tokens on loss-masked (target-generated) positions of the training split, kept in
ascending target-id order. The same object yields each serving engine's representation:
`token_map` (draft id -> target id; vLLM Medusa), `d2t` (int64 offsets, target id = draft id + d2t[draft id];
EAGLE-3) and `t2d` (bool mask over the target vocabulary; EAGLE-3). A draft token outside V' can never
be proposed, so verification by the target stays exact.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class DraftVocab:
    token_map: torch.Tensor  # int64 [V']: draft id -> target id, strictly ascending
    target_vocab_size: int

    def __post_init__(self) -> None:
        tm = self.token_map
        if tm.dim() != 1 or tm.dtype != torch.int64:
            raise ValueError(f"token_map must be a 1-D int64 tensor, got shape {tuple(tm.shape)} dtype {tm.dtype}")
        if tm.numel() == 0 or tm.numel() > self.target_vocab_size:
            raise ValueError(f"draft vocabulary of {tm.numel()} tokens for a target vocabulary of {self.target_vocab_size}")
        if tm.min() < 0 or tm.max() >= self.target_vocab_size:
            raise ValueError(f"token_map holds ids outside [0, {self.target_vocab_size})")
        if tm.numel() > 1 and not bool((tm[1:] > tm[:-1]).all()):
            raise ValueError("token_map must be strictly ascending (unique target ids in id order)")

    @property
    def size(self) -> int:
        return self.token_map.numel()

    @property
    def d2t(self) -> torch.Tensor:
        """int64 [V']: offsets such that target id = draft id + d2t[draft id] (EAGLE-3, vLLM, SGLang)."""
        return self.token_map - torch.arange(self.size, dtype=torch.int64, device=self.token_map.device)

    @property
    def t2d(self) -> torch.Tensor:
        """bool [V]: True where the target token is in the draft vocabulary."""
        mask = torch.zeros(self.target_vocab_size, dtype=torch.bool, device=self.token_map.device)
        mask[self.token_map] = True
        return mask

    def target_to_draft_table(self) -> torch.Tensor:
        """int64 [V]: draft id of each target token, -1 outside the draft vocabulary."""
        table = torch.full((self.target_vocab_size,), -1, dtype=torch.int64, device=self.token_map.device)
        table[self.token_map] = torch.arange(self.size, dtype=torch.int64, device=self.token_map.device)
        return table

    def to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return self.token_map.to(draft_ids.device)[draft_ids]

    def to_draft(self, target_ids: torch.Tensor) -> torch.Tensor:
        return self.target_to_draft_table().to(target_ids.device)[target_ids]

    @classmethod
    def from_d2t(cls, d2t: torch.Tensor, target_vocab_size: int) -> DraftVocab:
        d2t = d2t.to(torch.int64)
        return cls(d2t + torch.arange(d2t.numel(), dtype=torch.int64, device=d2t.device), target_vocab_size)

    @classmethod
    def full(cls, target_vocab_size: int) -> DraftVocab:
        return cls(torch.arange(target_vocab_size, dtype=torch.int64), target_vocab_size)


def count_target_tokens(rows, target_vocab_size: int, masked_only: bool = True, batch_size: int = 1024) -> np.ndarray:
    """Token counts [V] over `rows` (a datasets.Dataset or an iterable of dicts with input_ids, loss_mask)."""
    counts = np.zeros(target_vocab_size, dtype=np.int64)

    def add(ids: list[int], mask: list[int] | None) -> None:
        a = np.asarray(ids, dtype=np.int64)
        if masked_only:
            if mask is None or len(mask) != len(ids):
                raise ValueError("rows need a loss_mask column of the same length as input_ids")
            a = a[np.asarray(mask, dtype=bool)]
        if a.size and (a.min() < 0 or a.max() >= target_vocab_size):
            raise ValueError(f"token id {int(a.max())} outside the target vocabulary of {target_vocab_size}")
        counts[:] += np.bincount(a, minlength=target_vocab_size)

    if hasattr(rows, "iter") and hasattr(rows, "column_names"):  # datasets.Dataset: read columns in batches
        cols = ["input_ids"] + (["loss_mask"] if masked_only else [])
        for chunk in rows.select_columns(cols).iter(batch_size=batch_size):
            masks = chunk.get("loss_mask") or [None] * len(chunk["input_ids"])
            for ids, mask in zip(chunk["input_ids"], masks, strict=True):
                add(ids, mask)
    else:
        for row in rows:
            add(row["input_ids"], row.get("loss_mask"))
    return counts


def build_draft_vocab(
    rows,
    draft_vocab_size: int,
    target_vocab_size: int,
    always_include: Iterable[int] = (),
) -> DraftVocab:
    """The `draft_vocab_size` most frequent target-generated tokens in `rows` (plus `always_include`).

    Ties and a vocabulary larger than the tokens seen are settled by the counts over all tokens, then
    by the lowest id, so the result is deterministic and always has exactly `draft_vocab_size` entries.
    """
    if not 0 < draft_vocab_size <= target_vocab_size:
        raise ValueError(f"draft_vocab_size={draft_vocab_size} must be in [1, target vocab size {target_vocab_size}]")
    masked = count_target_tokens(rows, target_vocab_size, masked_only=True)
    if masked.sum() == 0:
        raise ValueError("no loss-masked tokens in the rows: cannot choose a draft vocabulary")
    overall = count_target_tokens(rows, target_vocab_size, masked_only=False)
    forced = sorted(set(int(i) for i in always_include))
    if len(forced) > draft_vocab_size:
        raise ValueError(f"{len(forced)} tokens to always include exceed draft_vocab_size={draft_vocab_size}")
    # lexsort: last key is primary. Descending masked count, then overall count, then ascending id.
    ids = np.arange(target_vocab_size)
    order = np.lexsort((ids, -overall, -masked))
    chosen = list(forced)
    forced_set = set(forced)
    for i in order:
        if len(chosen) == draft_vocab_size:
            break
        if int(i) not in forced_set:
            chosen.append(int(i))
    return DraftVocab(torch.tensor(sorted(chosen), dtype=torch.int64), target_vocab_size)


def coverage(vocab: DraftVocab, rows) -> float:
    """Fraction of loss-masked tokens in `rows` that the draft vocabulary contains."""
    counts = count_target_tokens(rows, vocab.target_vocab_size, masked_only=True)
    total = counts.sum()
    return float(counts[vocab.token_map.numpy()].sum() / total) if total else 0.0
