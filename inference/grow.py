"""Growing a draft tree from a drafter's next-token function: static trees by rank, EAGLE-2 dynamic trees.

A drafter supplies `expand(tokens, parents, depth) -> logits`: feed the draft nodes `tokens`
[B, F] (target ids), whose parents are the earlier expanded nodes `parents` [B, F] (expanded-node
ids: 0 is the root, then 1, 2, ... in the order nodes were fed; the root's parent is -1), and
return the draft logits [B, F, V'] of the token after each. Medusa ignores tokens and parents
(its head `depth` reads one hidden state); EAGLE feeds them through its decoder with a tree mask.
`id_map` [V'] maps a reduced draft vocabulary to target ids.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch

from headway.inference.drafter import DraftTree
from headway.inference.trees import Tree
from headway.sampling import SamplingParams, warp

Expand = Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]


def _to_target(ids: torch.Tensor, id_map: torch.Tensor | None) -> torch.Tensor:
    return ids if id_map is None else id_map[ids]


def draw_without_replacement(
    probs: torch.Tensor, n: int, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """n successive draws from probs [B, F, V], each from what is left renormalised.

    Returns ids [B, F, n] and the distribution each draw actually came from, [B, F, n, V]: the
    acceptance rule must divide by exactly that q.
    """
    cur = probs.clone()
    ids, qs = [], []
    for _ in range(n):
        cur = cur / cur.sum(-1, keepdim=True)
        x = torch.multinomial(cur.reshape(-1, cur.shape[-1]), 1, generator=generator).reshape(cur.shape[:-1])
        ids.append(x)
        qs.append(cur)
        cur = cur.scatter(-1, x[..., None], 0.0)
    return torch.stack(ids, -1), torch.stack(qs, -2)


def grow_static(
    expand: Expand,
    root: torch.Tensor,
    tree: Tree,
    sampling: SamplingParams,
    generator: torch.Generator | None = None,
    children: Literal["topk", "sample"] = "topk",
    id_map: torch.Tensor | None = None,
    vocab_size: int | None = None,
) -> DraftTree:
    """Fill a static tree level by level: the child of rank r is the r-th top token ("topk") or the
    r-th draw without replacement from the warped draft distribution ("sample", not when greedy)."""
    sample = children == "sample" and not sampling.greedy
    B, N, dev = root.shape[0], tree.num_nodes, root.device
    tables = tree.draft_tables(dev)
    tokens = torch.zeros(B, N + 1, dtype=torch.long, device=dev)
    tokens[:, 0] = root
    q = None
    for d, lv in enumerate(tables.levels):  # feed the nodes at depth d that have children
        logits = expand(tokens[:, lv.expand_nodes], lv.expand_parents.expand(B, -1), d)
        cf, cr, cn = lv.child_from, lv.child_rank, lv.child_nodes
        if sample:
            ids, qs = draw_without_replacement(warp(logits, sampling), lv.max_rank, generator)
            picked = ids[:, cf, cr]
            qd = qs[:, cf, cr]  # [B, C, V']
            if q is None:
                q = torch.zeros(B, N + 1, vocab_size or qd.shape[-1], device=dev)
            if id_map is None:
                q[:, cn] = qd
            else:
                q[:, cn] = torch.zeros(B, len(cn), q.shape[-1], device=dev).index_add_(2, id_map, qd)
        else:
            picked = logits.topk(lv.max_rank, dim=-1).indices[:, cf, cr]
        tokens[:, cn] = _to_target(picked, id_map)
    return DraftTree(tokens[:, 1:], tables.parents, q[:, 1:] if q is not None else None, static=tree)


def grow_dynamic(
    expand: Expand,
    root: torch.Tensor,
    depth: int,
    top_k: int,
    budget: int,
    id_map: torch.Tensor | None = None,
) -> DraftTree:
    """EAGLE-2: expand the top_k nodes of highest cumulative draft log-probability at each depth,
    each into its top_k children; after `depth` steps keep the `budget` best nodes of all candidates.

    Children are picked deterministically (top-k), so q is one-hot and needs no storing. A child's
    score never exceeds its parent's, and ties keep the earlier (parent) first, so the kept set
    always contains every kept node's parent. For the same reason growth stops early, with the
    same tree, once no frontier node scores above the budget-th best node so far in any row.
    """
    B, dev = root.shape[0], root.device
    logp = torch.log_softmax(
        expand(root[:, None], torch.full((B, 1), -1, dtype=torch.long, device=dev), 0).float(), -1
    )
    score, ids = logp[:, 0].topk(top_k, dim=-1)  # [B, k]
    tok = _to_target(ids, id_map)
    pool_tok, pool_score = [tok], [score.double()]
    pool_parent = [torch.full((B, top_k), -1, dtype=torch.long, device=dev)]  # pool index, -1 = root
    front_pool = torch.arange(top_k, device=dev).expand(B, top_k)  # pool indices of the frontier
    front_tok, front_score = tok, score.double()
    front_par_exp = torch.zeros(B, top_k, dtype=torch.long, device=dev)  # their parents' expanded ids
    next_exp, size = 1, top_k
    for d in range(1, depth):
        if size >= budget and _settled(pool_score, front_score, budget):
            break  # no deeper node can make the kept set: skip the remaining drafter forwards
        logp = torch.log_softmax(expand(front_tok, front_par_exp, d).float(), -1)  # [B, k, V']
        front_exp = torch.arange(next_exp, next_exp + top_k, device=dev).expand(B, top_k)
        next_exp += top_k
        val, ids = logp.topk(top_k, dim=-1)  # [B, k, k]
        cand = (front_score[:, :, None] + val.double()).reshape(B, -1)
        ctok = _to_target(ids, id_map).reshape(B, -1)
        pool_tok.append(ctok)
        pool_score.append(cand)
        pool_parent.append(front_pool.repeat_interleave(top_k, dim=1))
        best = cand.topk(top_k, dim=-1).indices  # [B, k], within this depth's candidates
        front_par_exp = front_exp.gather(1, best // top_k)
        front_pool = size + best
        front_tok, front_score = ctok.gather(1, best), cand.gather(1, best)
        size += top_k * top_k
    tok, score, parent = torch.cat(pool_tok, 1), torch.cat(pool_score, 1), torch.cat(pool_parent, 1)
    n = min(budget, size)
    keep = score.sort(dim=-1, descending=True, stable=True).indices[:, :n].sort(dim=-1).values  # pool order
    # Renumber: pool index -> tree node (1..n), root -> 0.
    node_of = torch.zeros(B, size + 1, dtype=torch.long, device=dev)
    node_of.scatter_(1, keep + 1, torch.arange(1, n + 1, device=dev).expand(B, n))
    parents = node_of.gather(1, parent.gather(1, keep) + 1)
    return DraftTree(tok.gather(1, keep), parents)


def _settled(pool_score: list[torch.Tensor], front_score: torch.Tensor, budget: int) -> bool:
    """Whether every row's kept set is final: its budget-th best score so far is at least the best
    frontier score (children score no higher, and a later node loses ties)."""
    kth = torch.cat(pool_score, 1).topk(budget, dim=-1).values[:, -1]
    return bool((front_score.max(-1).values <= kth).all())
