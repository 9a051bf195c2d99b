"""Prompt lookup as a drafter: continuations of earlier n-gram matches in the prompt and the text so far.

    drafter = LookupDrafter(max_ngram=4, min_ngram=1, max_tokens=10, num_candidates=3)
    engine = SpecEngine(target, drafter, TreeSpec("dynamic", depth=10, top_k=3, budget=30))

Per row the drafter keeps the token history (prompt + every accepted token) and an index
{n-gram -> positions right after each occurrence} for n in [min_ngram, max_ngram], extended as
tokens are observed, so a step never scans the history. `draft(root)` looks up the history's suffix
ending in root: the longest n first, then the most recent occurrence; the max_tokens tokens after
an occurrence (at most tokens_per_ngram x n of them: a short match is more often wrong) are one
candidate (continued periodically where it runs into the present), and up to num_candidates distinct
candidates are merged into a trie (shared prefixes once), at most `spec.num_nodes` nodes per row.

Candidates are picked without looking at the target's randomness, so q is one-hot (`DraftTree.q`
None): greedy and sampling acceptance both stay exact (see `accept_sampling`). A step where no row
matches drafts an empty tree: the engine's verification is then a plain decoding step.
"""

from __future__ import annotations

import torch

from headway.features import FeatureSpec
from headway.inference.drafter import Accepted, DraftTree
from headway.inference.drafters.trie import TokenTrie, stack_rows
from headway.inference.trees import TreeSpec
from headway.sampling import SamplingParams

# Occurrences looked at per n-gram length and step (most recent first): a frequent n-gram with the
# same continuation everywhere must not make a step cost O(history).
SCAN_PER_CANDIDATE = 4


class NgramIndex:
    """One row's history and its n-gram index: key tuple -> positions where a continuation starts."""

    def __init__(self, min_ngram: int, max_ngram: int) -> None:
        self.min_n, self.max_n = min_ngram, max_ngram
        self.tokens: list[int] = []
        self.starts: dict[tuple[int, ...], list[int]] = {}

    def extend(self, tokens: list[int]) -> None:
        hist, starts = self.tokens, self.starts
        for tok in tokens:
            hist.append(tok)
            end = len(hist)
            for n in range(self.min_n, min(self.max_n, end) + 1):
                starts.setdefault(tuple(hist[end - n :]), []).append(end)

    def candidates(
        self, root: int, length: int, count: int, per_ngram: int | None = None
    ) -> list[tuple[int, list[int]]]:
        """Up to `count` distinct continuations of (history + root), each up to `length` tokens (and
        `per_ngram` x n for an n-token match), as (matched n, tokens): the longest match first, then
        the most recent occurrence."""
        hist = self.tokens
        T = len(hist)
        out: list[tuple[int, list[int]]] = []
        seen: set[tuple[int, ...]] = set()
        for n in range(min(self.max_n, T + 1), self.min_n - 1, -1):
            occ = self.starts.get(tuple(hist[T - n + 1 :]) + (root,) if n > 1 else (root,))
            if not occ:
                continue
            span = length if per_ngram is None else min(length, per_ngram * n)
            for start in occ[: -SCAN_PER_CANDIDATE * count - 1 : -1]:
                cont = hist[start : start + span]
                # Past the history's end the match continues into root, then into its own
                # continuation (period T + 1 - start): a repeated phrase drafts full-length.
                for i in range(start + len(cont), start + span):
                    cont.append(root if i == T else cont[i - T - 1])
                key = tuple(cont)
                if any(s[: len(key)] == key for s in seen):  # adds no node to the trie
                    continue
                seen.add(key)
                out.append((n, cont))
                if len(out) == count:
                    return out
        return out


class LookupDrafter:
    def __init__(
        self,
        max_ngram: int = 4,
        min_ngram: int = 1,
        max_tokens: int = 10,
        num_candidates: int = 3,
        tokens_per_ngram: int | None = None,
    ):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"lookup: need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        if max_tokens < 1 or num_candidates < 1:
            raise ValueError(
                f"lookup: max_tokens and num_candidates must be >= 1, got {max_tokens}, {num_candidates}"
            )
        if tokens_per_ngram is not None and tokens_per_ngram < 1:
            raise ValueError(f"lookup: tokens_per_ngram must be >= 1 (or None), got {tokens_per_ngram}")
        self.min_ngram, self.max_ngram = min_ngram, max_ngram
        self.max_tokens, self.num_candidates = max_tokens, num_candidates
        self.tokens_per_ngram = tokens_per_ngram
        self.rows: list[NgramIndex] = []

    @property
    def max_nodes(self) -> int:
        return self.max_tokens * self.num_candidates

    def feature_spec(self) -> FeatureSpec:
        return FeatureSpec()

    def reset(self) -> None:
        self.rows = []

    def observe(self, acc: Accepted) -> None:
        if not self.rows:
            self.rows = [NgramIndex(self.min_ngram, self.max_ngram) for _ in range(acc.tokens.shape[0])]
        for row, toks, ok in zip(self.rows, acc.tokens.tolist(), acc.valid.tolist(), strict=True):
            row.extend([t for t, v in zip(toks, ok, strict=True) if v])

    def select_rows(self, keep: torch.Tensor) -> None:
        self.rows = [self.rows[i] for i in keep.tolist()]

    def candidates(self, roots: list[int], capped: bool = True) -> list[list[tuple[int, list[int]]]]:
        """Per row: (matched n, continuation) pairs, best first (capped=False: max_tokens long whatever n)."""
        per_ngram = self.tokens_per_ngram if capped else None
        return [
            row.candidates(r, self.max_tokens, self.num_candidates, per_ngram)
            for row, r in zip(self.rows, roots, strict=True)
        ]

    def tries(self, roots: list[int], limit: int, capped: bool = True) -> list[tuple[TokenTrie, list[int]]]:
        """Per row, the candidates merged into a trie of at most `limit` nodes (a node's origin is the
        rank of the candidate that added it), and each rank's matched n."""
        out = []
        for cands in self.candidates(roots, capped):
            trie = TokenTrie()
            for rank, (_, cont) in enumerate(cands):
                trie.insert(cont, origin=rank, limit=limit)
            out.append((trie, [n for n, _ in cands]))
        return out

    def draft(self, root: torch.Tensor, spec: TreeSpec, sampling: SamplingParams, generator) -> DraftTree:
        roots = root.tolist()
        return stack_rows([t for t, _ in self.tries(roots, spec.num_nodes)], roots, root.device)
