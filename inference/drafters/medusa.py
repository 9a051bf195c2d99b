"""Medusa heads as a drafter: head d reads the final-normed hidden state of the last accepted token.

drafter = MedusaDrafter(MedusaHeads.from_pretrained(DIR, target=model))
"""

from __future__ import annotations

from typing import Literal

import torch

from headway.features import FeatureSpec
from headway.heads.medusa import MedusaHeads
from headway.inference.drafter import Accepted, DraftTree
from headway.inference.grow import grow_dynamic, grow_static
from headway.inference.trees import Tree, TreeSpec
from headway.sampling import SamplingParams


def last_valid(valid: torch.Tensor) -> torch.Tensor:
    """[B, A] bool -> [B] index of each row's last True column."""
    return (valid.long() * torch.arange(1, valid.shape[1] + 1, device=valid.device)).argmax(-1)


class MedusaDrafter:
    def __init__(self, heads: MedusaHeads, children: Literal["topk", "sample"] = "topk"):
        self.heads, self.children = heads, children
        self.num_heads = heads.config.num_heads
        self.vocab_size = heads.config.vocab_size
        self.h: torch.Tensor | None = None

    def feature_spec(self) -> FeatureSpec:
        return FeatureSpec(final_normed=True)

    def reset(self) -> None:
        self.h = None

    def observe(self, acc: Accepted) -> None:
        rows = torch.arange(acc.tokens.shape[0], device=acc.tokens.device)
        self.h = acc.feats.final_normed[rows, last_valid(acc.valid)]

    def select_rows(self, keep: torch.Tensor) -> None:
        self.h = self.h[keep]

    def draft(self, root, spec: TreeSpec, sampling: SamplingParams, generator) -> DraftTree:
        if spec.max_depth > self.num_heads:
            raise ValueError(f"tree depth {spec.max_depth} exceeds the {self.num_heads} Medusa heads")
        logits = self.heads(self.h)  # [K, B, V']
        id_map = self.heads.token_map
        if spec.kind == "static" and (self.children == "topk" or sampling.greedy):
            return self._static_topk(logits, spec.tree, id_map)

        def expand(tokens, parents, d):  # every node at depth d gets head d's distribution
            return logits[d][:, None].expand(-1, tokens.shape[1], -1)

        if spec.kind == "static":
            return grow_static(
                expand, root, spec.tree, sampling, generator, self.children, id_map, self.vocab_size
            )
        return grow_dynamic(expand, root, spec.depth, spec.top_k, spec.budget, id_map)

    def _static_topk(self, logits, tree: Tree, id_map) -> DraftTree:
        t = tree.draft_tables(logits.device)  # node -> (head, rank), built once per tree
        top = logits[: tree.max_depth].topk(tree.max_rank, dim=-1).indices  # [D, B, R]
        ids = top[t.head, :, t.rank].T  # [B, N]
        tokens = ids if id_map is None else id_map[ids]
        return DraftTree(tokens, t.parents, static=tree)
