"""EAGLE-1 / EAGLE-3 drafters (heads/eagle.py) behind the drafting protocol; static or EAGLE-2 dynamic trees.

    drafter = EagleTreeDrafter(load_drafter(DIR, target))

The drafter's entry at position t reads [embedding of token t+1 ; feature of t] and predicts token
t+2 and the feature of t+1. After the target accepts tokens, each accepted token's entry is written
with the target's real feature, paired with the next accepted token (the last one with the new
root); the last entry's output is the root's predicted feature and its logits the root's children.
A tree node at depth d sits at position root + d - 1 and reads its own token with its parent's
predicted feature, attending to the committed entries and its tree ancestors. Tree entries are
cropped before the next draft.
"""

from __future__ import annotations

import torch

from headway.features import FeatureSpec
from headway.heads.eagle import EagleDrafter
from headway.inference.drafter import Accepted, DraftTree, join_observed
from headway.inference.grow import grow_dynamic, grow_static
from headway.inference.layout import additive_mask
from headway.inference.trees import TreeSpec
from headway.kv import crop, select_rows
from headway.sampling import SamplingParams


class EagleTreeDrafter:
    def __init__(self, drafter: EagleDrafter, children: str = "topk"):
        self.drafter, self.children = drafter, children
        self.id_map = drafter.token_map if getattr(drafter.config, "version", 1) == 3 else None
        self.vocab_size = drafter.config.vocab_size
        self.reset()

    def feature_spec(self) -> FeatureSpec:
        return self.drafter.feature_spec()

    def reset(self) -> None:
        self.cache = None
        self.kv_bias = None  # [B, 1, 1, S] over committed entries
        self.pending: tuple | None = None  # (tokens, valid, positions, model-space features)

    def observe(self, acc: Accepted) -> None:
        with torch.inference_mode():
            z = self.drafter.features_from_target(acc.feats)
        new = (acc.tokens, acc.valid, acc.positions, z)
        self.pending = new if self.pending is None else join_observed(self.pending, new)

    def select_rows(self, keep: torch.Tensor) -> None:
        if self.cache is not None:
            select_rows(self.cache, keep)
            self.kv_bias = self.kv_bias[keep]
        if self.pending is not None:
            self.pending = tuple(t[keep] for t in self.pending)

    @torch.inference_mode()
    def draft(self, root, spec: TreeSpec, sampling: SamplingParams, generator) -> DraftTree:
        (tokens, valid, positions, z), self.pending = self.pending, None
        B, A = tokens.shape
        dev, dtype = root.device, self.drafter.dtype
        if self.cache is None:
            self.cache = self.drafter.new_cache()
            self.kv_bias = torch.zeros(B, 1, 1, 0, dtype=dtype, device=dev)
        S = self.kv_bias.shape[-1]
        crop(self.cache, S)  # drop last step's tree entries
        # Each observed token's entry reads the next observed token, the last one the root.
        nxt_valid = torch.cat([valid[:, 1:], torch.zeros(B, 1, dtype=torch.bool, device=dev)], 1)
        nxt = torch.where(nxt_valid, torch.cat([tokens[:, 1:], tokens[:, :1]], 1), root[:, None])
        causal = torch.ones(A, A, dtype=torch.bool, device=dev).tril()
        block = (causal & valid[:, None, :]) | torch.eye(A, dtype=torch.bool, device=dev)
        mask = torch.cat([self.kv_bias.expand(B, 1, A, S), additive_mask(block[:, None], dtype)], -1)
        out = self.drafter.step(nxt, z, positions, self.cache, mask)
        self.kv_bias = torch.cat([self.kv_bias, additive_mask(valid, dtype)[:, None, None, :]], -1)
        rows = torch.arange(B, device=dev)
        last = (valid.long() * torch.arange(1, A + 1, device=dev)).argmax(-1)
        root_pos = positions[rows, last] + 1
        committed = self.kv_bias
        feats = out.feature[rows, last][:, None]  # [B, E, h]: predicted feature after each expanded node
        root_logits = out.logits[rows, last][:, None]
        anc = torch.zeros(B, 0, 0, dtype=torch.bool, device=dev)  # among tree entries (expanded nodes 1..)

        def expand(tok, parents, d):
            nonlocal anc, feats
            if d == 0:
                return root_logits
            F, U = tok.shape[1], anc.shape[1]
            # Expanded node e >= 1 is tree entry e - 1; node 0 (the last observed token) is committed.
            up = (parents - 1).clamp_min(0)[..., None].expand(-1, -1, U)
            rows_anc = anc.gather(1, up) & (parents > 0)[..., None] if U else anc.new_zeros(B, F, 0)
            new = torch.cat([rows_anc, torch.eye(F, dtype=torch.bool, device=dev).expand(B, F, F)], -1)
            m = torch.cat([committed.expand(B, 1, F, -1), additive_mask(new[:, None], dtype)], -1)
            parent_feat = feats.gather(1, parents[..., None].expand(-1, -1, feats.shape[-1]))
            step = self.drafter.step(
                tok, parent_feat, (root_pos[:, None] + d - 1).expand(B, F), self.cache, m
            )
            anc = torch.cat([torch.cat([anc, anc.new_zeros(B, U, F)], -1), new], 1)
            feats = torch.cat([feats, step.feature], 1)
            return step.logits

        if spec.kind == "static":
            return grow_static(
                expand, root, spec.tree, sampling, generator, self.children, self.id_map, self.vocab_size
            )
        return grow_dynamic(expand, root, spec.depth, spec.top_k, spec.budget, self.id_map)
