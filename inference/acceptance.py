"""Acceptance rules over a verified tree: greedy, lossless speculative sampling, Medusa's typical acceptance.

Each rule sees the target's logits at every tree node ([B, Q, V], node 0 the root) and returns
the deepest accepted node per row and the bonus token the target contributes after it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from headway.inference.layout import children_table
from headway.sampling import SamplingParams, pick, sample, warp


@dataclass
class Verdict:
    best: torch.Tensor  # [B] deepest accepted node (0: nothing accepted, only the bonus token)
    bonus: torch.Tensor  # [B] the target's token after `best`


def _deepest(accepted: torch.Tensor, depth: torch.Tensor) -> torch.Tensor:
    # argmax returns the first maximum: among equally deep accepted nodes, the lowest index wins.
    return torch.where(accepted, depth, -1).argmax(-1)


def _path_accepted(ok: torch.Tensor, anc: torch.Tensor) -> torch.Tensor:
    """ok [B, Q] (node's own test passed; root True), anc [B|1, Q, Q] -> every node on the path passed."""
    return ~(anc & ~ok[:, None, :]).any(-1)


def accept_greedy(pred, tokens, parents, anc, depth) -> Verdict:
    """Longest path whose tokens equal the target's argmax at their parents; bonus = argmax there.

    pred [B, Q]: the target's argmax at each node; only parents' entries are read, so the engine
    may leave leaves at -1 and compute the bonus of an accepted leaf afterwards."""
    match = tokens == pred.gather(1, parents.expand_as(tokens))
    ok = torch.cat([match.new_ones(match.shape[0], 1), match], 1)  # the root; a tree may have no nodes
    best = _deepest(_path_accepted(ok, anc), depth.expand_as(ok))
    return Verdict(best, pred.gather(1, best[:, None])[:, 0])


def accept_typical(
    logits, tokens, parents, anc, depth, s: SamplingParams, threshold: float, alpha: float, generator=None
) -> Verdict:
    """Medusa's typical acceptance (NOT lossless): a token passes when the target gives it more than
    min(threshold, alpha * exp(-entropy)) of its probability. At temperature 0 it is greedy."""
    if s.greedy:
        return accept_greedy(logits.argmax(-1), tokens, parents, anc, depth)
    p = warp(logits, s)
    ent = -(p * torch.log(p.clamp_min(1e-20))).sum(-1)  # [B, Q]
    limit = torch.minimum(torch.full_like(ent, threshold), alpha * torch.exp(-ent))
    par = parents.expand_as(tokens)
    p_tok = p.gather(1, par[..., None].expand(-1, -1, p.shape[-1])).gather(2, tokens[..., None])[..., 0]
    ok = torch.cat([tokens.new_ones(tokens.shape[0], 1, dtype=torch.bool), p_tok > limit.gather(1, par)], 1)
    best = _deepest(_path_accepted(ok, anc), depth.expand_as(ok))
    bonus = pick(logits.gather(1, best[:, None, None].expand(-1, 1, logits.shape[-1]))[:, 0], s, generator)
    return Verdict(best, bonus)


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(p - q, 0)): what the target still owes after a draft from q was rejected."""
    r = (p - q).clamp_min(0)
    total = r.sum(-1, keepdim=True)
    # total is 0 only if p <= q everywhere, i.e. p == q, where rejection has probability 0.
    return torch.where(total > 0, r / total.clamp_min(1e-30), p)


def accept_sampling(
    logits,
    tokens,
    parents,
    q,
    s: SamplingParams,
    generator=None,
    kids: torch.Tensor | None = None,
    correction=residual,
    probs=None,
) -> Verdict:
    """Lossless speculative sampling over a tree (SpecInfer's multi-draft rule).

    At the current node with target distribution p, the children x_1, x_2, ... are tried in order:
    x_j is accepted with probability min(1, p(x_j) / q_j(x_j)); if rejected, p becomes
    norm(max(p - q_j, 0)) and the next child is tried; when all are rejected, the bonus token is
    drawn from the final p. An accepted child becomes the current node with the target's own p.

    Why this is exact: each try is one step of ordinary speculative sampling (Leviathan et al.)
    with proposal q_j against target p, and such a step returns an exact sample of p *provided
    x_j ~ q_j given everything before it* -- it emits x with probability min(p, q_j)(x), and with
    the remaining mass defers to a sample of norm(max(p - q_j, 0)), which sums to p. By induction
    the chain of tries (and the final draw from the residual) returns a sample of the node's p.
    So q_j must be the distribution x_j was *actually* drawn from given the earlier siblings:
      - children sampled i.i.d. from the drafter: q_j = the drafter's distribution;
      - sampled without replacement: q_j = the drafter's distribution with x_1..x_{j-1} removed,
        renormalised (what `grow.draw_without_replacement` returns);
      - picked deterministically (top-k ranks, EAGLE-2's reranked tree): q_j is one-hot on x_j,
        so x_j is accepted with probability p(x_j) and the residual is p with x_j zeroed.
    (The one-hot rule is exact for *any* x_j chosen without looking at the target's randomness,
    since conditioned on x_j its q is one-hot; a sampled child treated as one-hot stays exact, it
    only accepts less often. Using a q that is neither, e.g. the drafter's q for a child drawn
    without replacement, is biased: tests/test_sampling.py shows the chi-square test catching it.)
    Which children exist never depends on the target's outputs, so the tree shape is harmless.
    Within an accepted child, the same argument applies to its children with the target's p there.

    q: [B, N, V] per node, or None for one-hot (deterministic picks). `correction` is the
    residual rule; tests swap it for a wrong one to show the chi-square test can fail.
    `probs(rows, nodes) -> [n, V]`: the target's warped distribution at those nodes, for callers
    that compute it only where it is read (nodes with children, and an accepted leaf); logits is
    then None.
    """
    B, Q = tokens.shape[0], tokens.shape[1] + 1
    dev = tokens.device
    if probs is None:
        p_all = warp(logits, s)

        def probs(r, n):
            return p_all[r, n]

    kids = children_table(parents.expand(B, -1)) if kids is None else kids
    rows = torch.arange(B, device=dev)
    cur = torch.zeros(B, dtype=torch.long, device=dev)
    p = probs(rows, cur)
    active = torch.ones(B, dtype=torch.bool, device=dev)
    bonus = torch.zeros(B, dtype=torch.long, device=dev)
    for _ in range(Q):
        moved = torch.zeros_like(active)
        for j in range(kids.shape[-1]):
            c = kids[rows, cur, j]
            trying = active & ~moved & (c > 0)
            if not trying.any():
                break
            node = c.clamp_min(1) - 1
            x = tokens[rows, node]
            px = p.gather(1, x[:, None])[:, 0]
            if q is None:
                qx, qrow = torch.ones_like(px), torch.zeros_like(p).scatter_(1, x[:, None], 1.0)
            else:
                qrow = q[rows, node]
                qx = qrow.gather(1, x[:, None])[:, 0]
            u = torch.rand(B, device=dev, generator=generator)
            ok = trying & (u * qx < px)
            moved |= ok
            cur = torch.where(ok, c, cur)
            rejected = (trying & ~ok)[:, None]
            p = torch.where(rejected, correction(p, qrow), p)
        stop = active & ~moved
        if stop.any():
            bonus = torch.where(stop, sample(p, generator), bonus)
        active = moved
        if not active.any():
            break
        went = moved.nonzero()[:, 0]
        p = p.index_copy(0, went, probs(went, cur[went]))
    return Verdict(cur, bonus)
