"""How a fused tree's nodes are split between the trained drafter and prompt lookup, step by step.

    planner = NodePlanner(profile, budget=12, max_depth=6, lookup_depth=10, curve=curve, draft_cost=0.02)
    stats = [planner.new_stats() for _ in rows]          # per row: {TRAINED, LOOKUP: DepthStats, BY_NGRAM: ...}
    plan = planner.plan(stats, [(trie.depth, trie.origin, ngrams) for trie, ngrams in lookup_tries])
    plan.trained, plan.lookup                            # the trained drafter's node count; per row, lookup nodes
    stats[row][LOOKUP].update(reached, accepted)         # after verification, from the accepted path
    stats[row][BY_NGRAM].add(n - 1, accepted)            # and per candidate: was its first token right

Every source keeps, per row and per depth d, exponentially forgetting counts of how often the
accepted path reached a node of its at depth d - 1 where it proposed a child (`reached`) and how
often one of those children was accepted (`accepted`); alpha_d = accepted / reached, pulled towards
a prior by a few pseudo-counts. A node's value is its estimated probability of being accepted:
- trained nodes: the accuracy profile's path probabilities (the nodes of `build_tree`, best first),
  each scaled by how the source's online alpha compares with the profile's along its depth;
- lookup nodes: the product of lookup's alpha down to the node's depth, halved per candidate rank
  (the most recent longest match first); where the candidates' matched n is given, the first factor
  is the online first-token acceptance of n-token matches (short matches are wrong more often:
  0.29 / 0.50 / 0.66 / 0.84 for n = 1..4 on Spec-Bench), which takes the place of lookup's
  `tokens_per_ngram` length cap: a 1-token match's long tail is priced out, a 4-token match's kept.
The plan keeps the most valuable nodes: the budget, or more where an extra node's value pays for
its verification time (expected tokens per second on the measured cost curve). Where lookup alone
promises more tokens per second than paying for the trained drafter's forwards too, the trained
drafter sits the step out (it catches up on the skipped tokens at its next draft). All Python floats.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from itertools import islice

from headway.inference.cost import cost_at
from headway.inference.trees import build_tree, per_rank

TRAINED, LOOKUP = 1, 2  # source bits of a fused node (a shared node has both)
BY_NGRAM = "lookup_by_ngram"  # stats key: lookup's first-token acceptance per matched n (index n - 1)
RANK_DISCOUNT = 0.5  # a later lookup candidate is worth this much of the one before it
LOOKUP_PRIOR = 0.5  # lookup's alpha per depth before anything was observed


@dataclass
class DepthStats:
    """One source's acceptance per depth on one row (index 0: depth 1)."""

    prior: list[float]
    weight: float = 2.0  # pseudo-observations behind the prior
    decay: float = 0.9  # forgetting per update: recent steps count most
    reached: list[float] = field(default_factory=list)
    accepted: list[float] = field(default_factory=list)

    def __post_init__(self):
        self.reached = [0.0] * len(self.prior)
        self.accepted = [0.0] * len(self.prior)

    def alpha(self, i: int) -> float:
        i = min(i, len(self.prior) - 1)
        return (self.accepted[i] + self.weight * self.prior[i]) / (self.reached[i] + self.weight)

    def update(self, reached: int, accepted: int) -> None:
        """This step the path reached `reached` depths where the source proposed, and `accepted` of them passed."""
        if reached <= 0:
            return
        self._forget()
        for i in range(min(reached, len(self.prior))):
            self.reached[i] += 1.0
            self.accepted[i] += 1.0 if i < accepted else 0.0

    def _forget(self) -> None:
        for i in range(len(self.prior)):
            self.reached[i] *= self.decay
            self.accepted[i] *= self.decay

    def add(self, i: int, ok: bool) -> None:
        """One observation of entry i alone (the others only forget)."""
        self._forget()
        i = min(i, len(self.prior) - 1)
        self.reached[i] += 1.0
        self.accepted[i] += 1.0 if ok else 0.0


def profile_nodes(accuracies: list[list[float]], max_nodes: int, max_depth: int) -> tuple[list[float], list[int]]:
    """The best static tree's node values (path probabilities under the profile, best first) and depths."""
    acc = per_rank(accuracies)
    tree = build_tree(accuracies, max_nodes, max_depth=max_depth)
    values = []
    for p in tree.paths:
        v = 1.0
        for d, r in enumerate(p):
            v *= acc[d][r] if d < len(acc) and r < len(acc[d]) else 0.0
        values.append(v)
    order = sorted(range(len(values)), key=lambda i: -values[i])
    return [values[i] for i in order], [len(tree.paths[i]) for i in order]


def conditional_alphas(values: list[float], depths: list[int], depth: int) -> list[float]:
    """P(depth d accepted | depth d - 1 accepted) that a tree of these nodes implies (disjoint siblings)."""
    reach = [0.0] * (depth + 1)
    reach[0] = 1.0
    for v, d in zip(values, depths, strict=True):
        if d <= depth:
            reach[d] += v
    return [min(1.0, reach[d] / reach[d - 1]) if reach[d - 1] > 0 else 0.0 for d in range(1, depth + 1)]


@dataclass
class Plan:
    trained: int  # nodes the trained drafter grows (one count for the batch; 0: not drafted this step)
    lookup: list[list[int]]  # per row: lookup trie nodes to merge, parents first


class NodePlanner:
    def __init__(
        self,
        accuracies: list[list[float]],
        budget: int,
        max_depth: int,
        lookup_depth: int,
        curve: dict[int, float] | None = None,
        draft_cost: float = 0.0,
        max_budget: int = 127,
        resize_trained: bool = True,
        max_ngram: int = 4,
    ):
        self.max_ngram = max_ngram
        self.max_budget = max(budget, max_budget)
        self.resize_trained = resize_trained  # False: the trained tree keeps its size (a fixed static tree)
        self.accuracies, self.lookup_depth = accuracies, lookup_depth
        self.set_budget(budget, max_depth)
        self.set_cost(curve, draft_cost)

    def set_budget(self, budget: int, max_depth: int) -> None:
        """The trained drafter's tree: the nodes it alone would verify (never fewer per step) and its
        depth; its prior alphas and node values follow from the profile."""
        if not 1 <= budget <= self.max_budget:
            raise ValueError(f"node budget must be in 1..{self.max_budget}, got {budget}")
        self.budget, self.max_depth = budget, max_depth
        values, depths = profile_nodes(self.accuracies, self.max_budget, max_depth)
        self.trained_prior = conditional_alphas(values[:budget], depths[:budget], max_depth)
        self.by_depth = [[v for v, d in zip(values, depths, strict=True) if d == k] for k in range(1, max(depths) + 1)]

    def set_cost(self, curve: dict[int, float] | None, draft_cost: float = 0.0) -> None:
        """The measured verify-cost curve and the trained drafter's seconds per step (None: keep
        exactly `budget` nodes, and always draft)."""
        self.verify = None if curve is None else [cost_at(curve, n + 1) for n in range(self.max_budget + 1)]
        self.draft_cost = draft_cost

    def new_stats(self) -> dict[int | str, DepthStats]:
        return {
            TRAINED: DepthStats(list(self.trained_prior)),
            LOOKUP: DepthStats([LOOKUP_PRIOR] * self.lookup_depth),
            BY_NGRAM: DepthStats([LOOKUP_PRIOR] * self.max_ngram),
        }

    def depth_factors(self, stats: DepthStats) -> list[float]:
        """Per depth: how the source's online acceptance down to that depth compares with the profile's."""
        out, r = [], 1.0
        for d in range(len(self.by_depth)):
            prior = stats.prior[min(d, len(stats.prior) - 1)]
            r *= stats.alpha(d) / prior if prior > 0 else 1.0
            out.append(r)
        return out

    @staticmethod
    def lookup_values(
        stats: DepthStats, depth: list[int], origin: list[int], first: list[float] | None = None
    ) -> list[float]:
        """Per lookup trie node (1..n): estimated acceptance probability. first: per candidate rank,
        the acceptance of its first token (default: lookup's depth-1 alpha)."""
        reach = [1.0]
        for d in range(1, max(depth) + 1):
            reach.append(reach[-1] * stats.alpha(d - 1))
        out = []
        for i in range(1, len(depth)):
            v = reach[depth[i]] * RANK_DISCOUNT ** origin[i]
            if first is not None and reach[1] > 0:
                v *= first[origin[i]] / reach[1]
            out.append(v)
        return out

    def _best(self, merged: list[float], draft_cost: float, floor: int) -> tuple[int, float]:
        """How many of the (best-first) node values to verify, and the expected tokens per second."""
        n_max = min(self.max_budget, len(merged))
        if self.verify is None:
            return min(self.budget, n_max), 0.0
        best, best_n, total = 1.0 / (self.verify[0] + draft_cost), 0, 1.0
        for n in range(1, n_max + 1):
            total += merged[n - 1]
            rate = total / (self.verify[n] + draft_cost)
            if rate > best or n <= floor:
                best, best_n = max(best, rate), n
        return best_n, best

    def plan(self, stats: list[dict[int | str, DepthStats]], lookup: list[tuple]) -> Plan:
        """stats: per row; lookup: per row (depth per node incl. the root, origin rank per node incl. the
        root[, matched n per candidate rank]).

        With a cost curve and a measured draft cost, the trained drafter is skipped for the step
        (`Plan.trained` 0) when every row expects more tokens per second from lookup alone."""
        n_max = self.max_budget if self.verify is not None else self.budget
        trained_counts, keep, alone, skip = [], [], [], self.draft_cost > 0
        for st, (depth, origin, *ngrams) in zip(stats, lookup, strict=True):
            first = [st[BY_NGRAM].alpha(n - 1) for n in ngrams[0]] if ngrams else None
            lv = self.lookup_values(st[LOOKUP], depth, origin, first) if len(depth) > 1 else []
            # Best first: a lookup node ties after trained ones and after its parent (lower index).
            streams = [_scaled(vals, r) for vals, r in zip(self.by_depth, self.depth_factors(st[TRAINED]), strict=True)]
            lk = sorted((-v, 1, i + 1) for i, v in enumerate(lv))
            merged = list(islice(heapq.merge(*streams, lk), n_max))
            # never fewer nodes than the trained drafter alone verifies
            n, rate = self._best([-m[0] for m in merged], self.draft_cost, self.budget)
            nodes = sorted(m[2] for m in merged[:n] if m[1])
            trained_counts.append(max(1, n - len(nodes)))
            keep.append(nodes)
            n_alone, rate_alone = self._best([-m[0] for m in lk], 0.0, 0)
            alone.append(sorted(m[2] for m in lk[:n_alone]))
            skip = skip and n_alone > 0 and rate_alone > rate
        if skip:
            return Plan(0, alone)
        n_trained = max(trained_counts) if self.resize_trained else self.budget
        return Plan(n_trained, keep)


def _scaled(values: list[float], factor: float):
    """(-value, 0, 0) merge keys of trained nodes of one depth, lazily: a plan reads only the best few."""
    for v in values:
        yield (-v * factor, 0, 0)
