"""Replays prompt-lookup settings on the target's own answers in the self-distilled mix (not Spec-Bench,
so the choice is not tuned on the evaluation set): tau and tokens per unit of verify cost, per domain.

    python docs/results/2026-12-02-smollm2/replay_lookup_orders.py runs/smollm2-135m/data 150 [amx]

Each example's first answer is decoded as the engine would with inference/drafters/lookup.py's
NgramIndex: history = prompt + accepted tokens, candidates after the root, the longest accepted prefix
among them plus the bonus token per step. `OrderedIndex` is NgramIndex with the order in which a
match's occurrences are continued made a choice (through the lookups of its index, its loop unchanged) (the library continues the most recent first); the
experiment found no order better than that, so the choice stayed here. COST is the verify-cost curve of the
2026-12-01 EAGLE-3 report (2-core CPU without AMX): a step over 1 + nodes tokens costs COST[1 + nodes];
with `amx`, the flatter curve of the 2026-12-01 lookup report (a Xeon with AMX).
"""

import sys
from collections import defaultdict

from datasets import load_from_disk

from headway.inference.drafters.lookup import NgramIndex

COST = {1: 1.0, 2: 1.04, 4: 1.09, 8: 1.23, 12: 1.35, 16: 1.45, 24: 1.67, 32: 1.90}
COST_AMX = {1: 1.0, 12: 1.0, 16: 1.06, 24: 1.27, 32: 1.48}


def verify_cost(n: int) -> float:
    ks = sorted(COST)
    for a, b in zip(ks, ks[1:], strict=False):
        if a <= n <= b:
            return COST[a] + (COST[b] - COST[a]) * (n - a) / (b - a)
    return COST[ks[-1]]


def scan_order(occ: list[int], order: str) -> list[int]:
    """A match's occurrences, best first."""
    if order == "recent":
        return occ[::-1]
    if order == "earliest" or len(occ) == 1:
        return list(occ)
    first = [occ[0], occ[-1]] if order == "earliest_then_recent" else [occ[-1], occ[0]]
    return first + occ[-2:0:-1]


class OrderedStarts(dict):
    """NgramIndex.starts whose lookups come back reordered: the index continues the last entries first,
    so handing it `scan_order` reversed makes it continue occurrences in that order, its own loop unchanged."""

    order = "recent"

    def get(self, key, default=None):
        occ = super().get(key)
        return default if not occ else scan_order(occ, self.order)[::-1]


class OrderedIndex(NgramIndex):
    def __init__(self, min_ngram: int, max_ngram: int) -> None:
        super().__init__(min_ngram, max_ngram)
        self.starts = OrderedStarts()

    def candidates(self, root, length, count, per_ngram=None, order="recent"):
        self.starts.order = order
        return super().candidates(root, length, count, per_ngram)


def first_answer(ids: list[int], mask: list[int]) -> tuple[list[int], list[int]]:
    i = mask.index(1)
    j = i
    while j < len(mask) and mask[j]:
        j += 1
    return ids[:i], ids[i:j]


def replay(prompt, answer, nmin, nmax, length, count, per_ngram, order, uncap_after_full=False):
    idx = OrderedIndex(nmin, nmax)
    idx.extend(prompt)
    t = steps = 0
    cost = 0.0
    full = False  # the last step accepted a whole lookup candidate: the text is being copied
    while t < len(answer) - 1:
        cap = None if uncap_after_full and full else per_ngram
        cands = idx.candidates(answer[t], length, count, cap, order)
        nodes, best = set(), 0
        for _, cont in cands:
            nodes.update(tuple(cont[: i + 1]) for i in range(len(cont)))
            m = 0
            while m < len(cont) and t + 1 + m < len(answer) and cont[m] == answer[t + 1 + m]:
                m += 1
            best = max(best, m)
        full = any(best == len(cont) for _, cont in cands) and best > 0
        steps += 1
        cost += verify_cost(1 + len(nodes))
        idx.extend(answer[t : t + 1 + best])
        t += 1 + best
    return len(answer) - 1, steps, cost


SETTINGS = {
    "ours today (recent, n1-4, L10, k3, 3/n)": dict(order="recent", nmin=1, nmax=4, length=10, count=3, per_ngram=3),
    "earliest, n1-4, L10, k3, 3/n": dict(order="earliest", nmin=1, nmax=4, length=10, count=3, per_ngram=3),
    "recent+earliest, n1-4, L10, k3, 3/n": dict(order="recent_then_earliest", nmin=1, nmax=4, length=10, count=3, per_ngram=3),
    "earliest+recent, n1-4, L10, k3, 3/n": dict(order="earliest_then_recent", nmin=1, nmax=4, length=10, count=3, per_ngram=3),
    "recent+earliest, n1-4, L10, k3, 5/n": dict(order="recent_then_earliest", nmin=1, nmax=4, length=10, count=3, per_ngram=5),
    "recent+earliest, n1-4, L10, k3, none": dict(order="recent_then_earliest", nmin=1, nmax=4, length=10, count=3, per_ngram=None),
    "recent+earliest, n1-4, L10, k4, 3/n": dict(order="recent_then_earliest", nmin=1, nmax=4, length=10, count=4, per_ngram=3),
    "ours, uncapped after a whole candidate": dict(order="recent", nmin=1, nmax=4, length=10, count=3, per_ngram=3, uncap_after_full=True),
    "ours, no cap": dict(order="recent", nmin=1, nmax=4, length=10, count=3, per_ngram=None),
    "HF-like (earliest, n1-2, L10, k1)": dict(order="earliest", nmin=1, nmax=2, length=10, count=1, per_ngram=None),
}


def main(data_dir: str, per_domain: int) -> None:
    ds = load_from_disk(f"{data_dir}/dataset")["train"]
    taken: dict[str, list] = defaultdict(list)
    for row in ds:
        if len(taken[row["domain"]]) < per_domain and 1 in row["loss_mask"]:
            taken[row["domain"]].append(first_answer(row["input_ids"], row["loss_mask"]))
    domains = sorted(taken)
    counts = ", ".join(f"{d} {len(taken[d])}" for d in domains)
    print(f"first answers of the train split, at most {per_domain} per domain ({counts}); cells: tau / tokens per unit of verify cost")
    print(f"{'setting':42s} " + " ".join(f"{d[:11]:>12s}" for d in domains + ['all']))
    for name, kw in SETTINGS.items():
        cells, T = [], [0, 0, 0.0]
        for d in domains:
            tok = st = 0
            c = 0.0
            for prompt, answer in taken[d]:
                a, b, e = replay(prompt, answer, **kw)
                tok, st, c = tok + a, st + b, c + e
            T = [T[0] + tok, T[1] + st, T[2] + c]
            cells.append(f"{tok / st:.2f}/{tok / c:.2f}")
        cells.append(f"{T[0] / T[1]:.2f}/{T[0] / T[2]:.2f}")
        print(f"{name:42s} " + " ".join(f"{x:>12s}" for x in cells), flush=True)


if __name__ == "__main__":
    if sys.argv[3:] == ["amx"]:
        COST = COST_AMX
    main(sys.argv[1], int(sys.argv[2]))
