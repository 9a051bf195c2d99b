"""The drafting interface: what the engine tells a drafter, and the tree a drafter hands back.

The engine never asks which head it holds. Per sequence of calls:

    drafter.observe(Accepted(...))          # after prefill: the prompt, with the target's features
    tree = drafter.draft(root, spec, s, g)  # candidates after `root` (the last emitted token)
    ...target verifies the tree...
    drafter.observe(Accepted(...))          # root + accepted draft tokens, with their features
    drafter.select_rows(keep)               # finished rows leave the batch

A drafter wrapped by another (a fused drafter) may be skipped for a step: it then observes twice
in a row and must draft from both observations (`join_observed`).

Features follow the drafter's `FeatureSpec` (headway/features.py): `feats.layers[i]`, `feats.final_normed`
hold the target's states at exactly the observed tokens. Medusa reads the final-normed state of
the last observed token; EAGLE pairs every observed feature with the token after it (the last one
with `root`, which `draft` receives).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from headway.features import FeatureSpec, TargetFeatures
from headway.inference.trees import Tree, TreeSpec
from headway.sampling import SamplingParams


@dataclass
class Accepted:
    """Tokens the target has committed since the last call, right-aligned rows of a batch."""

    tokens: torch.Tensor  # [B, A] long
    valid: torch.Tensor  # [B, A] bool: False on padding (left padding in the prompt, ragged tails later)
    positions: torch.Tensor  # [B, A] long: position ids the target used
    feats: TargetFeatures  # the target's states at these tokens, per the drafter's FeatureSpec


@dataclass
class DraftTree:
    """Candidates after the root. Node i (1..N) holds tokens[:, i-1]; its parent is 0 (root) or an earlier node."""

    tokens: torch.Tensor  # [B, N] long, target vocabulary
    parents: torch.Tensor  # [N] (one shape for the batch) or [B, N] long, values in 0..i-1 for node i
    # The distribution each node's token was drawn from, [B, N, V] over the target vocabulary. None:
    # every token was picked deterministically (top-k ranks), i.e. q is one-hot on the token itself.
    q: torch.Tensor | None = None
    static: Tree | None = None  # set when the shape is a known static tree (the engine caches its masks)


class Drafter(Protocol):
    def feature_spec(self) -> FeatureSpec:
        """The target states the drafter needs at observed tokens (empty spec: none)."""
        ...

    def reset(self) -> None:
        """Forget all state: a new batch of prompts follows."""
        ...

    def observe(self, acc: Accepted) -> None: ...

    def draft(
        self, root: torch.Tensor, spec: TreeSpec, sampling: SamplingParams, generator: torch.Generator | None
    ) -> DraftTree:
        """root [B]: the last emitted token (not yet verified into the cache). Returns the candidate tree."""
        ...

    def select_rows(self, keep: torch.Tensor) -> None:
        """Keep only these batch rows (indices into the current batch)."""
        ...


def join_observed(first: tuple[torch.Tensor, ...], second: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """Two observations with no draft in between as one: tensors [B, A, ...] whose element 1 is the
    valid mask; per row the valid entries of `first` then of `second`, right-aligned as in `Accepted`."""
    joined = [torch.cat([a, b], 1) for a, b in zip(first, second, strict=True)]
    valid = joined[1]
    order = torch.argsort(valid.to(torch.int8), dim=1, stable=True)  # padding first, order kept
    width = max(1, int(valid.sum(1).max()))
    order = order[:, order.shape[1] - width :]
    return tuple(t.gather(1, order.view(*order.shape, *([1] * (t.dim() - 2))).expand(-1, -1, *t.shape[2:])) for t in joined)
