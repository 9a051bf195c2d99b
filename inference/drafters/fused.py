"""A trained drafter's tree with prompt-lookup candidates merged into it: one tree, one target forward.

    drafter = FusedDrafter(EagleTreeDrafter(eagle), LookupDrafter(), NodePlanner(profile, budget=12, ...))

Per step the planner (inference/allocation.py) splits the nodes between the two sources from what
each has been accepting; the trained drafter grows its share, and the lookup candidates chosen are
inserted into that tree per row by (parent, token): a shared prefix is one node, verified once, and
new nodes are appended after the trained ones (parent < child holds). Rows with fewer lookup nodes
are padded (inference/drafters/trie.py). After verification, each source is credited with the
accepted draft tokens its own proposals covered, which is what the next plan reads.

Exactness: lookup nodes are picked from the token history, never from the target's randomness, so
their q is one-hot (`accept_sampling`'s rule): with a trained tree of deterministic picks q stays
None, with sampled children the lookup rows of q are one-hot. Which nodes exist depends only on
drafts, so greedy and sampling acceptance both stay lossless.
"""

from __future__ import annotations

import copy

import torch

from headway.features import FeatureSpec
from headway.inference.allocation import BY_NGRAM, LOOKUP, TRAINED, DepthStats, NodePlanner
from headway.inference.drafter import Accepted, DraftTree
from headway.inference.drafters.lookup import LookupDrafter
from headway.inference.drafters.trie import TokenTrie, stack_rows
from headway.inference.trees import TreeSpec, build_tree
from headway.sampling import SamplingParams


class FusedDrafter:
    def __init__(self, trained, lookup: LookupDrafter, planner: NodePlanner, accuracies: list[list[float]]):
        self.trained, self.lookup, self.planner = trained, lookup, planner
        self.accuracies = accuracies  # static trained trees of other sizes are built from this profile
        self._static: dict[tuple[int, int], TreeSpec] = {}
        # Since construction: nodes each source added to verified trees, accepted tokens credited to it.
        self.totals = {"trained_nodes": 0, "lookup_nodes": 0, "trained_tokens": 0, "lookup_tokens": 0}
        self.skipped = 0  # steps drafted by lookup alone
        # Acceptance over every row so far: where a new batch's rows start, so that what was learnt
        # on earlier prompts carries over (a short answer would otherwise be planned from priors).
        self.carry = planner.new_stats()
        self.reset()

    def feature_spec(self) -> FeatureSpec:
        return self.trained.feature_spec()

    def reset(self) -> None:
        self.trained.reset()
        self.lookup.reset()
        self.stats: list[dict[int | str, DepthStats]] = []
        # per row: trie, sources, children's sources; the first tokens of the lookup candidates verified (n, token)
        self.last: list[tuple[TokenTrie, list[int], list[int]]] | None = None
        self.firsts: list[list[tuple[int, int]]] = []

    def select_rows(self, keep: torch.Tensor) -> None:
        self.trained.select_rows(keep)
        self.lookup.select_rows(keep)
        self.stats = [self.stats[i] for i in keep.tolist()]

    def observe(self, acc: Accepted) -> None:
        if not self.stats:
            self.stats = [copy.deepcopy(self.carry) for _ in range(acc.tokens.shape[0])]
        if self.last is not None:
            self._credit(acc)
        self.trained.observe(acc)
        self.lookup.observe(acc)

    def _credit(self, acc: Accepted) -> None:
        """Each source: the accepted draft tokens inside its own proposals, and the depths it was tried at."""
        for st, (trie, src, kid_src), first, toks, ok in zip(
            self.stats, self.last, self.firsts, acc.tokens.tolist(), acc.valid.tolist(), strict=True
        ):
            accepted = [t for t, v in zip(toks, ok, strict=True) if v][1:]  # [0] is the root
            for n, tok in first:
                hit = bool(accepted) and accepted[0] == tok
                st[BY_NGRAM].add(n - 1, hit)
                self.carry[BY_NGRAM].add(n - 1, hit)
            path = trie.walk(accepted)
            for s in (TRAINED, LOOKUP):
                credit = 0
                while credit < len(path) and src[path[credit]] & s:
                    credit += 1
                last = path[credit - 1] if credit else 0
                reached = credit + (1 if kid_src[last] & s else 0)
                st[s].update(reached, credit)
                self.carry[s].update(reached, credit)
                self.totals["trained_tokens" if s == TRAINED else "lookup_tokens"] += credit
        self.last, self.firsts = None, []

    def _trained_spec(self, spec: TreeSpec, n: int) -> TreeSpec:
        if not self.planner.resize_trained:
            return spec
        if spec.kind == "dynamic":
            return TreeSpec("dynamic", depth=spec.depth, top_k=spec.top_k, budget=n)
        key = (n, spec.max_depth)
        if key not in self._static:
            self._static[key] = TreeSpec("static", build_tree(self.accuracies, n, max_depth=spec.max_depth))
        return self._static[key]

    def draft(self, root: torch.Tensor, spec: TreeSpec, sampling: SamplingParams, generator) -> DraftTree:
        roots = root.tolist()
        # Uncapped candidates: the planner prices each node by its match length instead of cutting it.
        lk = self.lookup.tries(roots, self.lookup.max_nodes, capped=False)
        plan = self.planner.plan(self.stats, [(t.depth, t.origin, ngrams) for t, ngrams in lk])
        # the first token of each candidate verified, with its match length: what BY_NGRAM learns from
        self.firsts = [
            [(ngrams[t.origin[k]], t.tokens[k - 1]) for k in keep if t.depth[k] == 1]
            for (t, ngrams), keep in zip(lk, plan.lookup, strict=True)
        ]
        if plan.trained == 0:  # lookup alone this step; the trained drafter catches up next time
            dt = DraftTree(root.new_zeros(len(roots), 0), root.new_zeros(len(roots), 0))
            self.skipped += 1
        else:
            dt = self.trained.draft(root, self._trained_spec(spec, plan.trained), sampling, generator)
        if not any(plan.lookup):
            self.totals["trained_nodes"] += dt.tokens.numel()
            self.last = [self._sources(TokenTrie.of(t, p), [TRAINED] * len(t)) for t, p in self._rows(dt)]
            return dt
        tries, self.last = [], []
        for (tok, par), (t, _), keep in zip(self._rows(dt), lk, plan.lookup, strict=True):
            trie = TokenTrie.of(tok, par)
            src = [TRAINED] * len(tok)
            where = {0: 0}  # lookup node -> fused node
            for n in keep:
                (f,) = trie.insert([t.tokens[n - 1]], start=where[t.parents[n - 1]])
                where[n] = f
                if f > len(src):
                    src.append(LOOKUP)
                else:
                    src[f - 1] |= LOOKUP
            tries.append(trie)
            self.last.append(self._sources(trie, src))
        fused = stack_rows(tries, roots, root.device)
        N_t, N = dt.tokens.shape[1], fused.tokens.shape[1]
        self.totals["trained_nodes"] += N_t * len(roots)
        self.totals["lookup_nodes"] += sum(len(t) for t in tries) - N_t * len(roots)
        if N == N_t:  # every lookup node merged into the trained tree
            return dt
        if dt.q is not None:  # lookup and padding nodes are deterministic picks: one-hot q
            extra = torch.zeros(*fused.tokens.shape, dt.q.shape[-1], dtype=dt.q.dtype, device=dt.q.device)
            extra[:, :N_t] = dt.q
            extra[:, N_t:].scatter_(-1, fused.tokens[:, N_t:, None], 1.0)
            fused.q = extra
        return fused

    @staticmethod
    def _rows(dt: DraftTree) -> list[tuple[list[int], list[int]]]:
        B = dt.tokens.shape[0]
        return list(zip(dt.tokens.tolist(), dt.parents.expand(B, -1).tolist(), strict=True))

    @staticmethod
    def _sources(trie: TokenTrie, src: list[int]) -> tuple[TokenTrie, list[int], list[int]]:
        """(trie, source bits per node with the root first, the sources among each node's children)."""
        full = [TRAINED | LOOKUP] + src  # the root is in every source's proposals
        kid_src = [0] * len(full)
        for i, p in enumerate(trie.parents):
            kid_src[p] |= full[i + 1]
        return trie, full, kid_src

