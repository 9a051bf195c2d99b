"""The decoding engine: prefill -> draft a tree -> verify it in one target forward -> accept -> compact.

    from headway.inference.engine import SpecEngine
    engine = SpecEngine(model, drafter, TreeSpec("static", default_tree(32)), eos_ids={2})
    out = engine.generate([prompt_ids_1, prompt_ids_2], max_new_tokens=128)
    out.tokens, out.accepted   # per prompt: generated ids; draft tokens accepted per verification

The target is the unmodified transformers model, driven with an additive 4-D mask (cache slots
the row may see + the tree's ancestor mask), explicit position ids (the row's next position +
node depth) and its own DynamicCache. After each verification only the accepted path's KV stays:
it is moved to the slots right after the old cache and the rest is cropped (`headway.kv`). Rows
of a batch accept different lengths; a row's unused slots stay in the cache but are masked out
for it (`self.kv_bias`), and positions are tracked per row, so holes cost memory, never correctness.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Literal

import torch
from transformers import DynamicCache

from headway.features import FeatureSpec, LayerCapture, TargetFeatures
from headway.inference.acceptance import (
    Verdict,
    accept_greedy,
    accept_sampling,
    accept_typical,
)
from headway.inference.drafter import Accepted, Drafter, DraftTree
from headway.inference.layout import TreeLayout, additive_mask
from headway.inference.trees import TreeSpec
from headway.kv import cache_kwarg, keep_path, select_rows
from headway.sampling import SamplingParams, pick, warp
from headway.target import stop_token_ids
from headway.tokens import left_pad

# One more lm_head call costs about as much as this many more rows in a call: the call reads the whole
# weight either way (2-core CPU, SmolLM2's 49,152 x 576 head in bf16: ~7.5 ms a call, ~0.1 ms a row).
LEAF_CALL_ROWS = 50
LEAF_RATE_EMA = 0.1  # weight of the latest step in the running share of steps that accept a leaf


def argmax(logits: torch.Tensor) -> torch.Tensor:
    """argmax over the last dimension in fp32: the same index (the first maximum, as `generate`'s fp32
    argmax), and several times faster than a bf16 argmax on CPU."""
    return logits.float().argmax(-1)


@dataclass
class Verification:
    """One target forward over the root and a draft tree (Q = N + 1 positions, root first)."""

    ids: torch.Tensor  # [B, Q] long: root, then the draft tokens
    positions: torch.Tensor  # [B, Q] long: position ids the target used
    hidden: torch.Tensor  # [B, Q, H] the target's final-normed hidden states
    feats: TargetFeatures  # at every position, per the drafter's FeatureSpec
    layout: TreeLayout  # the tree's shape tables
    logits: torch.Tensor | None = None  # [B, Q, V]; None until the lm_head runs over every node


@dataclass
class GenerateOutput:
    tokens: list[list[int]]  # per prompt: generated ids (a stopping EOS included)
    accepted: list[list[int]]  # per prompt: draft tokens accepted at each verification
    verify_forwards: list[int]  # per prompt: target forwards after prefill
    tree_depth: int  # deepest draft node the trees could hold
    timings: dict[str, float] = field(default_factory=dict)  # seconds per phase, summed over steps


class SpecEngine:
    def __init__(
        self,
        model,
        drafter: Drafter,
        spec: TreeSpec,
        sampling: SamplingParams | None = None,
        acceptance: Literal["exact", "typical"] = "exact",
        eos_ids: set[int] | None = None,
        pad_id: int = 0,
        typical_threshold: float = 0.09,
        typical_alpha: float = 0.3,
        profile: bool = False,
    ):
        self.model, self.drafter, self.spec = model, drafter, spec
        self.sampling = sampling or SamplingParams()
        self.acceptance, self.pad_id = acceptance, pad_id
        self.typical = (typical_threshold, typical_alpha)
        self.eos_ids = set(stop_token_ids(model) if eos_ids is None else eos_ids)
        self.decoder = model.get_decoder()
        self.lm_head = model.get_output_embeddings()
        self.fspec: FeatureSpec = drafter.feature_spec()
        n_layers = len(self.decoder.layers)
        for i in self.fspec.layers:
            if not 0 <= i < n_layers:
                raise ValueError(
                    f"drafter asks for target layer {i}, the target has layers 0..{n_layers - 1}"
                )
        self.profile = profile
        self.timings: dict[str, float] = defaultdict(float)
        self.leaf_rate = 0.5  # running share of greedy steps whose accepted node is a leaf

    # ------------------------------------------------------------ target forwards

    def _forward(self, ids, mask, pos, cache) -> tuple[torch.Tensor, TargetFeatures]:
        with LayerCapture(self.decoder, self.fspec.layers) as layers:
            hidden = self.decoder(
                input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, **cache_kwarg(self.decoder, cache)
            ).last_hidden_state
        return hidden, TargetFeatures(layers=layers)

    def _feats_at(self, feats: TargetFeatures, hidden, logits, idx) -> TargetFeatures:
        """The drafter's features at token columns idx [B, A]."""

        def take(t):
            return t.gather(1, idx[..., None].expand(-1, -1, t.shape[-1]))

        return TargetFeatures(
            layers={i: take(t) for i, t in feats.layers.items()},
            final_normed=take(hidden) if self.fspec.final_normed else None,
            logits=take(logits) if self.fspec.logits and logits is not None else None,
        )

    def _tick(self, name: str, t0: float) -> float:
        if self.profile and self.device.type == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        self.timings[name] += t - t0
        return t

    # ------------------------------------------------------------ decoding

    @torch.inference_mode()
    def prefill(self, prompts: list[list[int]], seed: int = 0):
        """Start a batch: left-padded prompts through the target; returns the first generated token per row."""
        if not prompts or any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        p = next(self.model.parameters())
        self.device, self.dtype = p.device, p.dtype
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(seed)
        self.drafter.reset()
        ids, valid = left_pad(prompts, self.pad_id)
        ids, valid = ids.to(self.device), valid.to(self.device)
        B, T = ids.shape
        pos = (valid.long().cumsum(-1) - 1).clamp_min(0)
        causal = torch.ones(T, T, dtype=torch.bool, device=self.device).tril()
        # Padding rows still see themselves, so no softmax row is empty.
        allowed = (causal & valid[:, None, :]) | torch.eye(T, dtype=torch.bool, device=self.device)
        self.cache = DynamicCache(config=self.model.config)
        hidden, feats = self._forward(ids, additive_mask(allowed[:, None], self.dtype), pos, self.cache)
        logits = self.lm_head(hidden) if self.fspec.logits else None
        root = pick(self.lm_head(hidden[:, -1]), self.sampling, self.generator)
        self.kv_bias = additive_mask(valid, self.dtype)[:, None, None, :]  # [B, 1, 1, S]
        self.next_pos = valid.sum(-1)
        arange = torch.arange(T, device=self.device).expand(B, T)
        self.drafter.observe(Accepted(ids, valid, pos, self._feats_at(feats, hidden, logits, arange)))
        return root

    def _layout(self, dt: DraftTree) -> TreeLayout:
        if dt.static is not None:
            return dt.static.layout(self.device, self.dtype)  # built once per tree
        return TreeLayout.of(dt.parents, self.dtype)

    def _accept(self, logits, dt: DraftTree, lay: TreeLayout) -> Verdict:
        if self.acceptance == "typical":
            return accept_typical(
                logits, dt.tokens, lay.parents, lay.anc, lay.depth, self.sampling, *self.typical, self.generator
            )
        if self.sampling.greedy:
            return accept_greedy(argmax(logits), dt.tokens, lay.parents, lay.anc, lay.depth)
        kids = lay.kids.expand(logits.shape[0], -1, -1)
        return accept_sampling(logits, dt.tokens, lay.parents, dt.q, self.sampling, self.generator, kids)

    def _forward_tree(self, root: torch.Tensor, dt: DraftTree) -> Verification:
        B, N = dt.tokens.shape
        lay = self._layout(dt)
        ids = torch.cat([root[:, None], dt.tokens], 1)
        pos = (self.next_pos[:, None] + lay.depth).expand(B, -1)
        S = self.kv_bias.shape[-1]
        mask = torch.cat([self.kv_bias.expand(B, 1, N + 1, S), lay.mask.expand(B, 1, N + 1, N + 1)], -1)
        hidden, feats = self._forward(ids, mask, pos, self.cache)
        return Verification(ids, pos, hidden, feats, lay)

    @torch.inference_mode()
    def verify(self, root: torch.Tensor, dt: DraftTree) -> Verification:
        """One target forward over root + tree nodes, logits at every node. Appends the tree's KV
        to the cache; `headway.kv.crop(engine.cache, S)` takes it back off."""
        v = self._forward_tree(root, dt)
        v.logits = self.lm_head(v.hidden)
        return v

    def _greedy_lazy(self, hidden, dt: DraftTree, lay: TreeLayout) -> Verdict:
        """Greedy acceptance reading the target's logits only where they are needed: at nodes with
        children, plus the accepted node when it is a leaf (its bonus token). Computing that leaf's
        bonus afterwards costs a second lm_head call, which reads the whole weight again: when leaves
        have often been accepted lately, every node goes through the one call instead."""
        B, Q = hidden.shape[:2]
        inner = lay.inner  # sorted; contains the root (when the tree has nodes)
        if self.leaf_rate * LEAF_CALL_ROWS >= Q - inner.numel():
            pred = argmax(self.lm_head(hidden))
            v = accept_greedy(pred, dt.tokens, lay.parents, lay.anc, lay.depth)
            is_inner = torch.zeros(Q, dtype=torch.bool, device=hidden.device)
            is_inner[inner] = True
            leaf = ~is_inner[v.best]
        else:
            pred = torch.full((B, Q), -1, dtype=torch.long, device=hidden.device)
            pred[:, inner] = argmax(self.lm_head(hidden[:, inner]))
            v = accept_greedy(pred, dt.tokens, lay.parents, lay.anc, lay.depth)
            leaf = v.bonus < 0
            if bool(leaf.any()):
                rows = leaf.nonzero()[:, 0]
                v.bonus[rows] = argmax(self.lm_head(hidden[rows, v.best[rows]]))
        self.leaf_rate += LEAF_RATE_EMA * (float(leaf.float().mean()) - self.leaf_rate)
        return v

    def _sampling_lazy(self, hidden, dt: DraftTree, lay: TreeLayout) -> Verdict:
        """Lossless sampling reading the target's distribution only at nodes with children and at
        accepted leaves (their bonus token): the lm_head and the warp (softmax, top-p sort over the
        vocabulary) skip the other leaves."""
        B, Q = hidden.shape[:2]
        inner = lay.inner
        slot = torch.full((Q,), -1, dtype=torch.long, device=hidden.device)
        slot[inner] = torch.arange(inner.numel(), device=hidden.device)
        p_inner = warp(self.lm_head(hidden[:, inner]), self.sampling)  # [B, I, V]

        def probs(rows, nodes):
            at = slot[nodes]
            leaf = at < 0
            out = p_inner[rows, at.clamp_min(0)] if inner.numel() else hidden.new_zeros(len(rows), 0)
            if bool(leaf.any()):
                rest = warp(self.lm_head(hidden[rows[leaf], nodes[leaf]]), self.sampling)
                out = rest if not inner.numel() else out.index_put((leaf.nonzero()[:, 0],), rest)
            return out

        kids = lay.kids.expand(B, -1, -1)
        return accept_sampling(None, dt.tokens, lay.parents, dt.q, self.sampling, self.generator, kids, probs=probs)

    @torch.inference_mode()
    def step(self, root: torch.Tensor):
        """One draft + verify + accept + compact. Returns (accepted tokens [B, L] root first,
        n_accepted [B] counting the root, bonus [B])."""
        t = time.perf_counter()
        dt = self.drafter.draft(root, self.spec, self.sampling, self.generator)
        t = self._tick("draft", t)
        B = dt.tokens.shape[0]
        S = self.kv_bias.shape[-1]
        ver = self._forward_tree(root, dt)
        lay = ver.layout
        t = self._tick("verify", t)  # the target's decoder; its lm_head counts under "accept"
        if self.acceptance == "exact" and not self.fspec.logits:  # the lm_head only where it is read
            v = (self._greedy_lazy if self.sampling.greedy else self._sampling_lazy)(ver.hidden, dt, lay)
        else:
            ver.logits = self.lm_head(ver.hidden)
            v = self._accept(ver.logits, dt, lay)
        n_acc = lay.depth.expand(B, -1).gather(1, v.best[:, None])[:, 0] + 1
        L = int(n_acc.max())
        rows = torch.arange(B, device=self.device)
        path = lay.path_of.expand(B, -1, -1)[rows, v.best][:, :L]  # root-first; beyond n_acc: padding
        t = self._tick("accept", t)
        keep_path(self.cache, S, path)
        new_valid = torch.arange(L, device=self.device)[None] < n_acc[:, None]
        self.kv_bias = torch.cat([self.kv_bias, additive_mask(new_valid, self.dtype)[:, None, None, :]], -1)
        t = self._tick("compact", t)
        acc_tokens = ver.ids.gather(1, path)
        feats = self._feats_at(ver.feats, ver.hidden, ver.logits, path)
        self.drafter.observe(Accepted(acc_tokens, new_valid, ver.positions.gather(1, path), feats))
        self.next_pos = self.next_pos + n_acc
        self._tick("observe", t)
        return acc_tokens, n_acc, v.bonus

    def _select(self, keep: torch.Tensor) -> None:
        select_rows(self.cache, keep)
        self.kv_bias = self.kv_bias[keep]
        self.next_pos = self.next_pos[keep]
        self.drafter.select_rows(keep)

    @torch.inference_mode()
    def generate(self, prompts: list[list[int]], max_new_tokens: int, seed: int = 0) -> GenerateOutput:
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        self.timings = defaultdict(float)
        t = time.perf_counter()
        root = self.prefill(prompts, seed)
        self._tick("prefill", t)
        B = len(prompts)
        out: list[list[int]] = [[] for _ in range(B)]
        accepted: list[list[int]] = [[] for _ in range(B)]
        forwards = [0] * B
        live = list(range(B))  # batch row -> prompt index

        def emit(row_tokens: list[list[int]]) -> list[int]:
            """Append each live row's new tokens; returns the batch rows still going."""
            going = []
            for r, toks in enumerate(row_tokens):
                o = out[live[r]]
                for tok in toks:
                    o.append(tok)
                    if tok in self.eos_ids or len(o) >= max_new_tokens:
                        break
                else:
                    going.append(r)
            return going

        going = emit([[x] for x in root.tolist()])
        while True:
            if len(going) < len(live):
                if not going:
                    break
                keep = torch.tensor(going, device=self.device)
                self._select(keep)
                root = root[keep]
                live = [live[r] for r in going]
            acc_tokens, n_acc, bonus = self.step(root)
            t = time.perf_counter()
            n_list, acc_list, bonus_list = n_acc.tolist(), acc_tokens.tolist(), bonus.tolist()
            for r, n in enumerate(n_list):
                accepted[live[r]].append(n - 1)
                forwards[live[r]] += 1
            going = emit([acc_list[r][1:n] + [bonus_list[r]] for r, n in enumerate(n_list)])
            root = bonus
            self._tick("bookkeeping", t)
        return GenerateOutput(out, accepted, forwards, self.spec.max_depth, dict(self.timings))
