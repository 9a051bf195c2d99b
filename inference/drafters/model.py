"""A small causal LM over the target's vocabulary as an autoregressive drafter, with tree attention.

    drafter = ModelDrafter(small_model)            # two-model speculative decoding
    drafter = ModelDrafter(layer_skip(target, 8))  # the target's first 8 layers + its norm and lm_head

Each `draft` feeds, in one forward, the tokens the target accepted since the last draft plus the
new root; then one forward per tree depth over that depth's expanded nodes, each attending to the
committed prefix and its own ancestors. The next `draft` crops the root and tree nodes away again.
EAGLE drafters follow the same pattern with the target's features as extra input.
"""

from __future__ import annotations

import copy
from typing import Literal

import torch
from torch import nn
from transformers import DynamicCache

from headway.features import FeatureSpec
from headway.inference.drafter import Accepted, DraftTree, join_observed
from headway.inference.grow import grow_dynamic, grow_static
from headway.inference.layout import additive_mask
from headway.inference.trees import TreeSpec
from headway.kv import cache_kwarg, crop, select_rows
from headway.sampling import SamplingParams


def layer_skip(target, num_layers: int):
    """A drafter model sharing the target's embedding, first `num_layers` decoder layers, final norm
    and lm_head (no copies of weights). Llama-style decoders (embed_tokens, layers, norm, rotary_emb)."""
    dec = target.get_decoder()
    if not 1 <= num_layers <= len(dec.layers):
        raise ValueError(f"layer_skip: num_layers must be in 1..{len(dec.layers)}, got {num_layers}")
    config = copy.deepcopy(target.config)
    config.num_hidden_layers = num_layers
    with torch.device("meta"):
        draft = type(target)(config)
    ddec = draft.get_decoder()
    for name in ("embed_tokens", "norm", "rotary_emb"):
        setattr(ddec, name, getattr(dec, name))
    ddec.layers = nn.ModuleList(dec.layers[:num_layers])
    draft.set_output_embeddings(target.get_output_embeddings())
    return draft.eval()


class ModelDrafter:
    def __init__(self, model, children: Literal["topk", "sample"] = "topk"):
        self.model, self.children = model, children
        self.vocab_size = model.get_output_embeddings().weight.shape[0]
        self.reset()

    def feature_spec(self) -> FeatureSpec:
        return FeatureSpec()

    def reset(self) -> None:
        self.cache: DynamicCache | None = None
        self.kv_bias = None  # [B, 1, 1, S] over committed slots
        self.pending: Accepted | None = None

    def observe(self, acc: Accepted) -> None:
        if self.pending is not None:  # a step went undrafted: draft from both observations
            p = self.pending
            tokens, valid, positions = join_observed((p.tokens, p.valid, p.positions), (acc.tokens, acc.valid, acc.positions))
            acc = Accepted(tokens, valid, positions, acc.feats)
        self.pending = acc

    def select_rows(self, keep: torch.Tensor) -> None:
        select_rows(self.cache, keep)
        self.kv_bias = self.kv_bias[keep]
        p = self.pending
        if p is not None:
            self.pending = Accepted(p.tokens[keep], p.valid[keep], p.positions[keep], p.feats)

    def _run(self, ids, mask, pos):
        dtype = self.kv_bias.dtype
        out = self.model(
            input_ids=ids, attention_mask=mask.to(dtype), position_ids=pos, use_cache=True, **cache_kwarg(self.model, self.cache)
        )
        return out.logits

    @torch.inference_mode()
    def draft(self, root, spec: TreeSpec, sampling: SamplingParams, generator) -> DraftTree:
        p, self.pending = self.pending, None
        B, dev = root.shape[0], root.device
        dtype = next(self.model.parameters()).dtype
        if self.cache is None:
            self.cache = DynamicCache(config=self.model.config)
            self.kv_bias = torch.zeros(B, 1, 1, 0, dtype=dtype, device=dev)
        S = self.kv_bias.shape[-1]
        crop(self.cache, S)  # drop last step's root and tree nodes
        A = p.tokens.shape[1]
        root_pos = p.positions.masked_fill(~p.valid, -1).max(-1).values + 1
        ids = torch.cat([p.tokens, root[:, None]], 1)
        valid = torch.cat([p.valid, torch.ones(B, 1, dtype=torch.bool, device=dev)], 1)
        pos = torch.cat([p.positions, root_pos[:, None]], 1)
        causal = torch.ones(A + 1, A + 1, dtype=torch.bool, device=dev).tril()
        block = (causal & valid[:, None, :]) | torch.eye(A + 1, dtype=torch.bool, device=dev)
        mask = torch.cat([self.kv_bias.expand(B, 1, A + 1, S), additive_mask(block[:, None], dtype)], -1)
        root_logits = self._run(ids, mask, pos)[:, -1:]
        self.kv_bias = torch.cat([self.kv_bias, additive_mask(p.valid, dtype)[:, None, None, :]], -1)
        committed = self.kv_bias  # the tree below sees the committed prefix plus its ancestors
        anc = torch.ones(B, 1, 1, dtype=torch.bool, device=dev)  # among expanded nodes (root first)

        def expand(tokens, parents, d):
            nonlocal anc
            if d == 0:
                return root_logits
            F, E = tokens.shape[1], anc.shape[1]
            rows = anc.gather(1, parents[..., None].expand(-1, -1, E))  # [B, F, E] the parents' ancestry
            eye = torch.eye(F, dtype=torch.bool, device=dev).expand(B, F, F)
            new = torch.cat([rows, eye], -1)
            m = torch.cat([committed.expand(B, 1, F, -1), additive_mask(new[:, None], dtype)], -1)
            logits = self._run(tokens, m, (root_pos[:, None] + d).expand(B, F))
            anc = torch.cat(
                [torch.cat([anc, torch.zeros(B, E, F, dtype=torch.bool, device=dev)], -1), new], 1
            )
            return logits

        if spec.kind == "static":
            return grow_static(
                expand, root, spec.tree, sampling, generator, self.children, None, self.vocab_size
            )
        return grow_dynamic(expand, root, spec.depth, spec.top_k, spec.budget)
