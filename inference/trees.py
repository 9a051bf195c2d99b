"""Draft trees: static trees as path lists, chains, the optimal static tree for measured head accuracies.

Node numbering everywhere in inference/: node 0 is the root (the last emitted token, whose KV is
not yet in the target's cache); nodes 1..N are draft tokens, each after its parent (parent < child).

A static tree is Medusa's list of paths: `[[0], [0, 0], [1]]` is the root's top-1 child, that
child's top-1 child, and the root's top-2 child; the number at depth d is a rank of the drafter's
distribution at depth d.

    from headway.inference.trees import build_tree, load_accuracies, chain, default_tree
    tree = build_tree(load_accuracies("runs/medusa/head_accuracy.json"), budget=32)
    print(tree.paths, expected_tau(tree, acc))

Head-accuracy JSON (what `scripts/head_accuracy.py` writes; the tree builder reads it):

    {"accuracy": [[top1, top2, ..., top10],   # head 1 (depth 1): cumulative top-k accuracy
                  [top1, top2, ..., top10],   # head 2 (depth 2)
                  ...], ...}

(`heads` is accepted as the key too.) `accuracy[d][r]` is the fraction of positions where the correct token is among depth d+1's top r+1
predictions (non-decreasing in r). Each head may also be a mapping with a `topk` list. The
builder uses per-rank accuracies (differences of the cumulative ones) and, as Medusa does,
treats depths as independent: a node's acceptance probability is the product along its path.
"""

from __future__ import annotations

import heapq
import json
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Literal

import torch

from headway.inference.layout import DraftTables, TreeLayout

# Per-depth cumulative top-k accuracies used when nothing was measured: roughly Medusa-1 heads on
# Vicuna-7B (head 1 about 0.6 top-1, falling with depth). Only the tree's shape depends on it.
DEFAULT_ACCURACIES: list[list[float]] = [
    [0.60, 0.72, 0.78, 0.81, 0.83, 0.85, 0.86, 0.87, 0.88, 0.89],
    [0.35, 0.47, 0.54, 0.58, 0.61, 0.63, 0.65, 0.66, 0.67, 0.68],
    [0.22, 0.32, 0.38, 0.42, 0.45, 0.47, 0.49, 0.50, 0.51, 0.52],
    [0.15, 0.23, 0.28, 0.32, 0.35, 0.37, 0.38, 0.39, 0.40, 0.41],
    [0.12, 0.18, 0.22, 0.25, 0.27, 0.29, 0.30, 0.31, 0.32, 0.33],
    [0.10, 0.15, 0.19, 0.21, 0.23, 0.25, 0.26, 0.27, 0.28, 0.29],
    [0.08, 0.13, 0.16, 0.18, 0.20, 0.21, 0.22, 0.23, 0.24, 0.25],
]

# A rough prior for feature drafters (EAGLE): each depth conditioned on the accepted path, so accuracy
# falls slowly with depth. Used for `tree_budget: auto` when no accuracy file is given.
DRAFTER_DEFAULT_ACCURACIES: list[list[float]] = [
    [round(a * 0.93**d, 3) for a in (0.70, 0.80, 0.85, 0.87, 0.89, 0.90, 0.91, 0.92, 0.92, 0.93)]
    for d in range(8)
]


@dataclass
class Tree:
    paths: list[tuple[int, ...]]  # sorted by (depth, ranks): parents precede children
    # Tensor tables derived from the paths, per device: written only by `layout` and `draft_tables`.
    _tables: dict = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self):
        paths = sorted({tuple(int(r) for r in p) for p in self.paths}, key=lambda p: (len(p), p))
        if not paths:
            raise ValueError("a tree needs at least one path")
        have = set(paths)
        for p in paths:
            if not p or min(p) < 0:
                raise ValueError(f"tree path {list(p)} must be a non-empty list of ranks >= 0")
            if len(p) > 1 and p[:-1] not in have:
                raise ValueError(f"tree path {list(p)} has no parent path {list(p[:-1])} in the tree")
        self.paths = paths

    @property
    def num_nodes(self) -> int:
        return len(self.paths)

    @property
    def max_depth(self) -> int:
        return max(len(p) for p in self.paths)

    @property
    def max_rank(self) -> int:
        return max(max(p) for p in self.paths) + 1

    @cached_property
    def index(self) -> dict[tuple[int, ...], int]:
        return {p: i + 1 for i, p in enumerate(self.paths)}

    @cached_property
    def parents(self) -> list[int]:
        return [self.index[p[:-1]] if len(p) > 1 else 0 for p in self.paths]

    @cached_property
    def depths(self) -> list[int]:
        return [0] + [len(p) for p in self.paths]

    @cached_property
    def ranks(self) -> list[int]:
        return [p[-1] for p in self.paths]

    def layout(self, device: torch.device, dtype: torch.dtype) -> TreeLayout:
        """The verification tables (batch dimension 1), built once per device and dtype."""
        key = ("layout", str(device), dtype)
        if key not in self._tables:
            self._tables[key] = TreeLayout.of(torch.tensor(self.parents, device=device), dtype)
        return self._tables[key]

    def draft_tables(self, device: torch.device) -> DraftTables:
        """The drafting tables (head, rank, levels per node), built once per device."""
        key = ("draft", str(device))
        if key not in self._tables:
            self._tables[key] = DraftTables.of(self.parents, self.ranks, device)
        return self._tables[key]

    def to_json(self) -> list[list[int]]:
        return [list(p) for p in self.paths]


def chain(k: int) -> Tree:
    """k draft tokens in a row."""
    if k < 1:
        raise ValueError(f"a chain needs at least one draft token, got {k}")
    return Tree([(0,) * d for d in range(1, k + 1)])


def per_rank(cumulative: list[list[float]]) -> list[list[float]]:
    """Cumulative top-k accuracies -> probability that rank r (exactly) is right."""
    return [[c[0]] + [max(0.0, b - a) for a, b in zip(c, c[1:], strict=False)] for c in cumulative]


def build_tree(accuracies: list[list[float]], budget: int, max_depth: int | None = None) -> Tree:
    """The static tree with `budget` nodes maximising expected accepted length (independent depths).

    A node's value is the product of per-rank accuracies along its path; a child is never worth
    more than its parent, so taking the best frontier node `budget` times is optimal.
    """
    if budget < 1:
        raise ValueError(f"tree budget must be >= 1, got {budget}")
    acc = per_rank(accuracies)[: max_depth or len(accuracies)]
    heap = [(-acc[0][r], (r,)) for r in range(len(acc[0]))]
    heapq.heapify(heap)
    paths = []
    while heap and len(paths) < budget:
        neg, p = heapq.heappop(heap)
        paths.append(p)
        if len(p) < len(acc):
            for r, a in enumerate(acc[len(p)]):
                heapq.heappush(heap, (neg * a, p + (r,)))
    return Tree(paths)


def expected_tau(tree: Tree, accuracies: list[list[float]]) -> float:
    """Expected tokens per verification (the bonus token included) under independent depths."""
    acc = per_rank(accuracies)
    total = 1.0
    for p in tree.paths:
        prob = 1.0
        for d, r in enumerate(p):
            prob *= acc[d][r] if d < len(acc) and r < len(acc[d]) else 0.0
        total += prob
    return total


def default_tree(budget: int, depth: int = 5) -> Tree:
    """A sensible static tree for a node budget, from the default accuracy profile."""
    return build_tree(DEFAULT_ACCURACIES, budget, max_depth=depth)


def load_accuracies(path: str | Path) -> list[list[float]]:
    """Read the head-accuracy JSON (format in this module's docstring); errors name the file and key."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"head-accuracy file not found: {path}")
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON: {e}") from e
    key = "accuracy" if isinstance(raw, dict) and "accuracy" in raw else "heads"
    heads = raw.get(key) if isinstance(raw, dict) else None
    if not isinstance(heads, list) or not heads:
        raise ValueError(
            f"{path}: expected a non-empty list of per-head top-k accuracies under key 'accuracy'"
        )
    out = []
    for i, h in enumerate(heads):
        if isinstance(h, dict):
            h = h.get("topk")
        if not isinstance(h, list) or not h or not all(isinstance(v, int | float) for v in h):
            raise ValueError(
                f"{path}: {key}[{i}] must be a list of cumulative top-k accuracies (or {{'topk': [...]}})"
            )
        if any(not 0 <= v <= 1 for v in h) or any(b < a - 1e-9 for a, b in zip(h, h[1:], strict=False)):
            raise ValueError(f"{path}: {key}[{i}] must be non-decreasing values in [0, 1], got {h}")
        out.append([float(v) for v in h])
    return out


def load_paths(path: str | Path) -> Tree:
    """A static tree from a JSON file holding a list of paths (or {"paths": [...]})."""
    raw = json.loads(Path(path).read_text())
    if isinstance(raw, dict):
        raw = raw.get("paths")
    if not isinstance(raw, list):
        raise ValueError(f"{path}: expected a list of paths such as [[0], [0, 0], [1]]")
    return Tree([tuple(p) for p in raw])


@dataclass(frozen=True)
class TreeSpec:
    """What shape of tree the drafter should grow this step; the engine passes it through."""

    kind: Literal["static", "dynamic"]
    tree: Tree | None = None  # static (a chain is a static tree)
    depth: int = 6  # dynamic: expansion steps
    top_k: int = 8  # dynamic: children per expanded node, and nodes expanded per depth
    budget: int = 32  # dynamic: nodes kept after reranking

    def __post_init__(self):
        if self.kind == "static" and self.tree is None:
            raise ValueError("a static TreeSpec needs a tree")
        if self.kind == "dynamic" and min(self.depth, self.top_k, self.budget) < 1:
            raise ValueError(
                f"dynamic tree needs depth, top_k, budget >= 1, got {self.depth}, {self.top_k}, {self.budget}"
            )

    @property
    def num_nodes(self) -> int:
        return self.tree.num_nodes if self.kind == "static" else self.budget

    @property
    def max_depth(self) -> int:
        return self.tree.max_depth if self.kind == "static" else self.depth

    def describe(self) -> dict:
        if self.kind == "static":
            return {
                "kind": "static",
                "nodes": self.tree.num_nodes,
                "depth": self.tree.max_depth,
                "paths": self.tree.to_json(),
            }
        return {"kind": "dynamic", "nodes": self.budget, "depth": self.depth, "top_k": self.top_k}
