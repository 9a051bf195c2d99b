"""Tensor tables of a draft tree: what verification and drafting index with.

Node numbering as in `trees`: node 0 is the root, nodes 1..N the draft tokens, parent < child.
Q = N + 1 counts the root; D is the deepest node's depth.

- `TreeLayout`: what the engine needs to verify a tree (ancestors, depths, the attention mask,
  each node's root-first path); a leading batch dimension of 1 for a static tree shared by every
  row, B for per-row (dynamic) trees.
- `DraftTables`: what drafters need to fill a static tree (each node's head and rank, and the
  tree level by level).

A static tree builds both once per device (`Tree.layout`, `Tree.draft_tables`), so a decoding step
only indexes with them.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """bool -> float additive mask (0 where allowed, dtype min elsewhere): eager attention needs float."""
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(
        ~allowed, torch.finfo(dtype).min
    )


def ancestor_matrix(parents: torch.Tensor) -> torch.Tensor:
    """parents [B, N] (0 = root, parent < child) -> anc [B, N+1, N+1] bool, anc[b, i, j]: j is i or above i."""
    B, N = parents.shape
    Q = N + 1
    full = torch.cat([torch.zeros(B, 1, dtype=torch.long, device=parents.device), parents], 1)  # root -> root
    anc = torch.eye(Q, dtype=torch.bool, device=parents.device).expand(B, Q, Q).clone()
    up = torch.arange(Q, device=parents.device).expand(B, Q)
    # Walk every node up one level per round (the root is its own parent): depth rounds reach the root.
    for _ in range(Q):
        up = full.gather(1, up)
        anc.scatter_(2, up[..., None], True)
        if bool((up == 0).all()):
            break
    return anc


def path_table(anc: torch.Tensor, depth: torch.Tensor) -> torch.Tensor:
    """anc [B, Q, Q], depth [B, Q] -> [B, Q, D+1]: row i lists i's ancestors root-first (0-padded)."""
    B, Q, _ = anc.shape
    D = int(depth.max())
    out = torch.zeros(B, Q, D + 2, dtype=torch.long, device=anc.device)
    slot = torch.where(anc, depth[:, None, :].expand(B, Q, Q), D + 1)  # non-ancestors go to a spill column
    out.scatter_(2, slot, torch.arange(Q, device=anc.device).expand(B, Q, Q).contiguous())
    return out[..., : D + 1]


def children_table(parents: torch.Tensor) -> torch.Tensor:
    """parents [B, N] -> [B, Q, C]: the children of each node in index order, -1 padded."""
    B, N = parents.shape
    Q = N + 1
    node = torch.arange(1, Q, device=parents.device).expand(B, N)
    is_child = torch.zeros(B, Q, Q, dtype=torch.bool, device=parents.device)
    is_child.scatter_(
        2,
        node[:, None, :].expand(B, Q, N),
        parents[:, None, :].expand(B, Q, N) == torch.arange(Q, device=parents.device)[None, :, None],
    )
    C = max(1, int(is_child.sum(-1).max()))
    key = torch.where(is_child, torch.arange(Q, device=parents.device), Q)
    kids = key.sort(-1).values[..., :C]
    return torch.where(kids < Q, kids, -1)


@dataclass(frozen=True)
class TreeLayout:
    """A tree's verification tables; the leading dimension is 1 (static tree) or B (a tree per row)."""

    parents: torch.Tensor  # [1|B, N] long, 0 = root
    depth: torch.Tensor  # [1|B, Q] long, root 0
    anc: torch.Tensor  # [1|B, Q, Q] bool: anc[b, i, j] = j is i or an ancestor of i
    mask: torch.Tensor  # [1|B, 1, Q, Q] additive float mask in the model dtype
    path_of: torch.Tensor  # [1|B, Q, D+1] long: node indices from the root down to each node (0-padded)

    @classmethod
    def of(cls, parents: torch.Tensor, dtype: torch.dtype) -> TreeLayout:
        """From parents [N] or [B, N] (0 = root); the mask in `dtype`. Errors name the broken rule."""
        parents = parents if parents.dim() == 2 else parents[None]
        if bool((parents >= torch.arange(1, parents.shape[1] + 1, device=parents.device)).any()):
            raise ValueError("draft tree: every node's parent must come before it (parents[i-1] < i)")
        anc = ancestor_matrix(parents)
        depth = anc.sum(-1) - 1
        return cls(parents, depth, anc, additive_mask(anc[:, None], dtype), path_table(anc, depth))

    # Read only by some acceptance rules; built on first use, so once per static tree.
    @cached_property
    def kids(self) -> torch.Tensor:
        """[1|B, Q, C] long: each node's children in index order, -1 padded."""
        return children_table(self.parents)

    @cached_property
    def inner(self) -> torch.Tensor:
        """[I] long, sorted: nodes with children in any row (the root included)."""
        return torch.unique(self.parents)


@dataclass(frozen=True)
class Level:
    """One depth of a static tree as a drafter fills it: the nodes fed, and where their children go."""

    expand_nodes: torch.Tensor  # [F] tree nodes at this depth that have children (root level: [0])
    expand_parents: torch.Tensor  # [F] expanded-node id of each one's parent (root level: [-1]; see grow)
    child_nodes: torch.Tensor  # [C] tree nodes at depth + 1
    child_from: torch.Tensor  # [C] index into expand_nodes of each child's parent
    child_rank: torch.Tensor  # [C] rank of each child among its parent's draft candidates
    max_rank: int


@dataclass(frozen=True)
class DraftTables:
    """A static tree's per-node tables on one device, for drafters that fill it."""

    parents: torch.Tensor  # [N] long, 0 = root
    head: torch.Tensor  # [N] long: depth - 1, the Medusa head (draft step) proposing the node
    rank: torch.Tensor  # [N] long: the node's rank in its parent's draft distribution
    levels: tuple[Level, ...]  # depth 0 (the root expands) .. D - 1

    @classmethod
    def of(cls, parents: list[int], ranks: list[int], device: torch.device) -> DraftTables:
        """From a static tree's parents and ranks (node i + 1 at index i, parents before children).

        Expanded-node ids number the nodes in the order they are fed: the root 0, then each level's
        `expand_nodes` in turn (the `expand` contract in `grow`)."""
        depth = [0]
        for p in parents:
            depth.append(depth[p] + 1)

        def t(xs: list[int]) -> torch.Tensor:
            return torch.tensor(xs, dtype=torch.long, device=device)

        levels, exp_id = [], {0: 0}
        for d in range(max(depth)):
            children = [n for n in range(1, len(depth)) if depth[n] == d + 1]
            expand = sorted({parents[c - 1] for c in children})
            up = [-1]  # the root (id 0) has no parent
            if d:  # this level's nodes are fed next, in order
                up = [exp_id[parents[n - 1]] for n in expand]
                for n in expand:
                    exp_id[n] = len(exp_id)
            pos = {n: j for j, n in enumerate(expand)}
            levels.append(
                Level(
                    expand_nodes=t(expand),
                    expand_parents=t(up),
                    child_nodes=t(children),
                    child_from=t([pos[parents[c - 1]] for c in children]),
                    child_rank=t([ranks[c - 1] for c in children]),
                    max_rank=max(ranks[c - 1] for c in children) + 1,
                )
            )
        return cls(t(parents), t(depth[1:]) - 1, t(ranks), tuple(levels))
