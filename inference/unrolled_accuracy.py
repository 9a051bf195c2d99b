"""Per-depth top-k accuracy of an EAGLE-1 / EAGLE-3 drafter unrolled on real rows: its accuracy profile.

    hits = eagle_topk_hits(drafter, feats, batch, steps=6, topk=10)   # per depth: (hits [B, topk], n [B])

Step i is the training-time test's (heads/eagle.py `unroll`): at anchor t it reads the true token
t+1+i and its own step i-1 output feature (step 0: the target's feature of t), and its top-k is
scored on token t+2+i wherever tokens t+1 .. t+2+i are all target-generated (`align_step`). Since the
tokens above are the true ones, step i's top-1 rate is P(depth i+1 accepted | the path above it
was): the conditional per-depth acceptance the tree builder multiplies along a path. A label
outside the draft vocabulary counts as a miss at every rank.
"""

from __future__ import annotations

import torch

from headway.features import TargetFeatures
from headway.heads.eagle import Eagle3Drafter, EagleDrafter
from headway.heads.eagle_objective import align_step

PAIRS_PER_CHUNK = 1024  # logits [pairs, vocabulary] are scored a chunk at a time


@torch.no_grad()
def eagle_topk_hits(
    drafter: EagleDrafter, feats: TargetFeatures, batch: dict[str, torch.Tensor], steps: int, topk: int = 10, pad_id: int = 0
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per depth 1..steps: (hits [B, topk] float, where hits[:, j] counts labels ranked within the top
    j+1, pairs scored [B] long), per batch row."""
    ids, attn = batch["input_ids"], batch["attention_mask"]
    B = ids.shape[0]
    z = drafter.features_from_target(feats)
    anchors = align_step(batch, 1, pad_id).mask if steps > 1 else None
    vocab = drafter.draft_vocab if isinstance(drafter, Eagle3Drafter) else None
    row_of = torch.arange(B, device=ids.device)[:, None].expand_as(ids)
    out = []
    for i, u in enumerate(drafter.unroll(ids, z, attn, steps, pad_id, anchors=anchors)):
        al = align_step(batch, i, pad_id)
        m = u.take(al.mask) & u.valid
        labels, rows, hidden = u.take(al.labels)[m], u.take(row_of)[m], u.hidden[m]
        wanted = labels if vocab is None else vocab.to_draft(labels)  # -1 outside the draft vocabulary
        hits = torch.zeros(B, topk, device=ids.device)
        for s in range(0, len(wanted), PAIRS_PER_CHUNK):
            logits = drafter.logits(hidden[s : s + PAIRS_PER_CHUNK])
            ranked = logits.topk(min(topk, logits.shape[-1]), dim=-1).indices
            first = (ranked == wanted[s : s + PAIRS_PER_CHUNK, None]).float().cumsum(-1)
            if first.shape[-1] < topk:
                first = torch.cat([first, first[:, -1:].expand(-1, topk - first.shape[-1])], -1)
            hits.index_add_(0, rows[s : s + PAIRS_PER_CHUNK], first)
        out.append((hits, torch.bincount(rows, minlength=B)))
    return out
