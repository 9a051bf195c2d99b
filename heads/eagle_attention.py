"""Attention for EAGLE drafters: float masks for drafting, and the training-time-test (TTT) kernel.

    mask = causal_mask(attention_mask, dtype)              # [B, 1, T, T] float: 0 seen, min masked
    mask = offset_causal_mask(q_len, past_len, dtype, dev) # [1, 1, q, past + q] for a chain after a cache

The drafter's decoder layer is transformers' own class; its attention module looks its kernel up by
`config._attn_implementation`. Drafters set that to ATTENTION_NAME, registered here with transformers'
`AttentionInterface`: without the `eagle_ttt_block` kwarg it is plain SDPA (or eager) on the float mask
it is given; with `eagle_ttt_block=T` it computes the unrolled-step attention of EAGLE-3's training-time
test without materialising the (steps x T)^2 mask:

- the key/value cache holds step 0 (all T positions) then steps 1 .. i (one key per anchor each);
- the query of step i at anchor t sees step-0 keys at positions s <= t (the causal block, with padding,
  given as `attention_mask` [B, 1, Q, T]) and, of every later step j <= i, only the key at the same t.

That is exactly what drafting from anchor t sees: the target-fed cache up to t, then its own chain.
`ttt_attention` is the kernel training runs; `ttt_attention_materialised`, the same attention in plain
autograd ops, is its tested reference and serves eager base attention and attention dropout. On the
SmolLM2 EAGLE-3 recipe (one CPU thread, kernel inputs of a step with 8 x 1,024 tokens) forward and
backward over the 7 unrolled steps took 1.08 s against 1.43 s; torch's CPU flash attention with the
diagonal merged through its log-sum-exp took 1.78 s (its kernel does ~40 GFLOP/s here, the bf16 matmuls
~450), so the scores stay materialised, in the matmul dtype, and are only ever walked a few times. Since
then the softmax backward is one aten pass (kernel backward 798 -> 483 ms in a profiled 2-thread step,
docs/results/2026-12-04-smollm2/eagle3-step/).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import AttentionInterface

from headway.attention import gqa_sdpa_attention

ATTENTION_NAME = "headway_eagle"
BASE_ATTENTION_ATTR = "headway_base_attention"  # on the drafter's layer config: "sdpa" or "eager"


def causal_mask(attention_mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[B, T] key padding (1 = real token) -> float [B, 1, T, T]: query t sees real keys s <= t.

    A query on padding still sees key 0, so no row is all masked (no NaN from an empty softmax).
    """
    B, T = attention_mask.shape
    device = attention_mask.device
    tri = torch.ones(T, T, dtype=torch.bool, device=device).tril()
    keep = tri[None] & attention_mask.bool()[:, None, :]
    keep[:, :, 0] = True
    return mask_to_float(keep[:, None], dtype)


def offset_causal_mask(q_len: int, past_len: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Float [1, 1, q, past + q]: a chain of q queries after `past_len` cached keys, each seeing its past."""
    keys = torch.arange(past_len + q_len, device=device)
    queries = torch.arange(q_len, device=device) + past_len
    return mask_to_float((keys[None, :] <= queries[:, None])[None, None], dtype)


def mask_to_float(keep: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Boolean keep-mask -> additive float mask (0 kept, dtype's min masked); eager needs float masks."""
    zero = torch.zeros((), dtype=dtype, device=keep.device)
    return torch.where(keep, zero, torch.finfo(dtype).min)


def _repeat_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    return x if groups == 1 else x.repeat_interleave(groups, dim=1)


def eager_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **_):
    """Plain softmax(QK^T + mask)V with a float mask; the reference the other paths are tested against."""
    groups = query.shape[1] // key.shape[1]
    key, value = _repeat_kv(key, groups), _repeat_kv(value, groups)
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        scores = scores + attention_mask[..., : key.shape[-2]]
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    probs = F.dropout(probs, p=dropout, training=module.training)
    return torch.matmul(probs, value).transpose(1, 2).contiguous(), None


class _SoftmaxTo(torch.autograd.Function):
    """softmax(x) in fp32, returned in `dtype`; backward reads the returned probabilities, so only they are kept.

    Plain `softmax(dtype=fp32).to(bf16)` keeps the fp32 probabilities for backward and the bf16 copy for
    the value matmul: 6 bytes per score, where TTT has B x heads x anchors x T scores per unrolled step
    (1.8 GB over seven steps of the SmolLM2 EAGLE-3 recipe). This keeps the 2 bytes the matmul needs."""

    @staticmethod
    def forward(ctx, scores, dtype):
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(dtype)
        ctx.save_for_backward(probs)
        return probs

    @staticmethod
    def backward(ctx, grad):
        (probs,) = ctx.saved_tensors
        p, g = probs.float(), grad.to(torch.float32, copy=True)
        dot = torch.matmul(g.unsqueeze(-2), p.unsqueeze(-1)).squeeze(-1)  # sum(g * p), no [.., keys] temporary
        return g.sub_(dot).mul_(p), None


def _matmul_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype matmuls on `x` run in: autocast's when it is on (bf16 mixed precision), else x's own."""
    device = x.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype


def ttt_attention(module, query, key, value, attention_mask, block: int, dropout=0.0, scaling=None):
    """Step i of the unroll: the causal block over the T step-0 keys + the diagonal of each later step.

    Queries: Q anchors (Q = T at step 0; steps >= 1 may run on a gathered subset of anchors). Keys: the
    T step-0 keys, then Q keys per later step in the same anchor order. `attention_mask` [B, 1, Q, T]
    is the causal/padding block of those anchors' rows. The same numbers as `ttt_attention_materialised`
    (its scores are rounded to the matmul dtype too) with fewer passes over the [B, heads, Q, T] scores:
    the block's scores go through bf16 (the matmul dtype) matmuls, the diagonal's (`later` per query) in
    fp32, and the softmax with its value product is one autograd node (`_SoftmaxValues`) whose backward
    is one fused pass (aten's softmax backward), so no fp32 copy of the scores is ever made. Without
    dropout only.
    """
    T, (B, H, Q, D) = block, query.shape
    _check_ttt_shapes(query, key, block)
    later, kv_heads = (key.shape[2] - T) // Q, key.shape[1]
    dtype, out_dtype = _matmul_dtype(query), torch.promote_types(query.dtype, value.dtype)
    scaling = D**-0.5 if scaling is None else scaling
    q = query.to(dtype).reshape(B, kv_heads, H // kv_heads, Q, D)  # [B, kv heads, group, Q, D]
    key, value = key.to(dtype), value.to(dtype)
    scores = torch.matmul(q.flatten(2, 3), key[:, :, :T].transpose(2, 3)).view(*q.shape[:-1], T)
    k_later = key[:, :, T:].view(B, kv_heads, later, Q, D)  # step j+1's key at each anchor
    diag = torch.einsum("bkgqd,bkjqd->bkgqj", q.float(), k_later.float()) * scaling
    v_later = value[:, :, T:].view(B, kv_heads, later, Q, D)
    with torch.autocast(query.device.type, enabled=False):  # dtypes are set here, not per op
        out = _SoftmaxValues.apply(scores, diag, attention_mask[..., :T], scaling, value[:, :, :T], v_later)
    return out.view(B, H, Q, D).to(out_dtype).transpose(1, 2).contiguous(), None


def _check_ttt_shapes(query, key, block: int) -> None:
    Q = query.shape[2]
    if key.shape[2] < block or (key.shape[2] - block) % Q:
        raise ValueError(f"TTT attention: {Q} queries and {key.shape[2]} keys for a step-0 block of {block}")


class _SoftmaxValues(torch.autograd.Function):
    """softmax([block scores * scale + mask ; diagonal scores]) @ [block values ; diagonal values].

    scores [B, KV, G, Q, T] (q.k, matmul dtype); diag [B, KV, G, Q, later] (fp32, scaled); mask
    [B, 1, Q, T] additive; v_block [B, KV, T, D]; v_later [B, KV, later, Q, D] -> fp32 [B, KV, G, Q, D].
    Kept for backward: the probabilities once, in the matmul dtype. Backward is softmax's over the whole
    row (block and diagonal), its row sum rowsum(dP * P) accumulated in fp32, so each row's score
    gradient sums to zero as softmax's does; the diagonal's dP enters it in the matmul dtype.
    """

    @staticmethod
    def forward(ctx, scores, diag, mask, scale: float, v_block, v_later):
        B, KV, G, Q, T = scores.shape
        later = diag.shape[-1]
        logits = torch.empty(B, KV, G, Q, T + later, dtype=scores.dtype, device=scores.device)
        torch.add(mask.to(scores.dtype)[:, :, None], scores, alpha=scale, out=logits[..., :T])
        logits[..., T:] = diag
        probs = torch.softmax(logits, dim=-1)  # fp32 inside, stored in the matmul dtype
        out = torch.matmul(probs[..., :T].reshape(B, KV, G * Q, T), v_block).view(B, KV, G, Q, -1).float()
        if later:
            out += torch.einsum("bkgqj,bkjqd->bkgqd", probs[..., T:].float(), v_later.float())
        ctx.save_for_backward(probs, v_block, v_later)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, d_out):
        probs, v_block, v_later = ctx.saved_tensors
        B, KV, G, Q, width = probs.shape
        later = v_later.shape[2]
        T = width - later
        d_out = d_out.float()
        do = d_out.to(probs.dtype).reshape(B, KV, G * Q, -1)
        d_v_block = torch.matmul(probs[..., :T].reshape(B, KV, G * Q, T).transpose(2, 3), do)
        dp = torch.matmul(do, v_block.transpose(2, 3)).view(B, KV, G, Q, T)  # d loss / d block probabilities
        p_later = probs[..., T:].float()
        d_v_later = torch.einsum("bkgqj,bkgqd->bkjqd", p_later, d_out).to(v_later.dtype)
        if later:  # the diagonal's probabilities share each row's sum with the block's
            dp_later = torch.einsum("bkgqd,bkjqd->bkgqj", d_out, v_later.float())
            dp = torch.cat([dp, dp_later.to(dp.dtype)], dim=-1)
        # p * (dP - rowsum(dP * P)) in one pass, the row sum in fp32: aten's softmax backward, 3.5x faster on
        # CPU than fp32 row blocks and as exact (docs/results/2026-12-04-smollm2/eagle3-step/softmax_backward_micro.py)
        d_logits = torch._softmax_backward_data(dp, probs, -1, probs.dtype)
        d_scores = d_logits[..., :T].mul_(ctx.scale)  # the block's scores were scaled in forward
        return d_scores, d_logits[..., T:].float(), None, None, d_v_block, d_v_later


def ttt_attention_materialised(module, query, key, value, attention_mask, block: int, dropout=0.0, scaling=None):
    """Step i of the unroll in plain autograd ops, every score in memory: the reference `ttt_attention` is
    tested against, used with eager base attention and with attention dropout.

    Queries: Q anchors (Q = T at step 0; steps >= 1 may run on a gathered subset of anchors). Keys: the
    T step-0 keys, then Q keys per later step in the same anchor order. `attention_mask` [B, 1, Q, T]
    is the causal/padding block of those anchors' rows. Memory per step is what backward needs and no
    more: inputs cast once to the matmul dtype (as autocast would, per matmul), key/value heads shared by
    their query group instead of repeated, probabilities kept once in the matmul dtype (`_SoftmaxTo`).
    """
    T, (B, H, Q, D) = block, query.shape
    _check_ttt_shapes(query, key, block)
    later, kv_heads, out_dtype = (key.shape[2] - T) // Q, key.shape[1], query.dtype
    dtype = _matmul_dtype(query)
    q = query.to(dtype).reshape(B, kv_heads, H // kv_heads, Q, D)  # [B, kv heads, group, Q, D]
    key, value = key.to(dtype), value.to(dtype)
    scaling = D**-0.5 if scaling is None else scaling
    block_scores = torch.matmul(q.flatten(2, 3), key[:, :, :T].transpose(2, 3)).view(B, H, Q, T)
    scores = [block_scores * scaling + attention_mask[..., :T]]
    for j in range(later):  # step j+1's key at the query's own anchor only
        k_j = key[:, :, None, T + j * Q : T + (j + 1) * Q]
        scores.append((q * k_j).sum(-1).view(B, H, Q, 1) * scaling)
    probs = _SoftmaxTo.apply(torch.cat(scores, dim=-1), dtype)
    probs = F.dropout(probs, p=dropout, training=module.training)
    grouped = probs.view(B, kv_heads, H // kv_heads, Q, T + later)
    out = torch.matmul(grouped[..., :T].flatten(2, 3), value[:, :, :T]).view(B, H, Q, D).float()
    for j in range(later):
        v_j = value[:, :, None, T + j * Q : T + (j + 1) * Q]
        out = out + (grouped[..., T + j : T + j + 1] * v_j).view(B, H, Q, D)
    return out.to(torch.promote_types(out_dtype, value.dtype)).transpose(1, 2).contiguous(), None


def eagle_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    block = kwargs.pop("eagle_ttt_block", None)
    eager = getattr(module.config, BASE_ATTENTION_ATTR, "sdpa") == "eager"
    if block is not None:
        # eager keeps the plain reference; so does attention dropout, which only it applies
        reference = eager or (dropout and module.training)
        kernel = ttt_attention_materialised if reference else ttt_attention
        return kernel(module, query, key, value, attention_mask, block, dropout=dropout, scaling=scaling)
    if attention_mask is None and query.shape[2] > 1:
        raise ValueError("EAGLE drafter attention needs an explicit float mask for more than one query")
    if attention_mask is not None and attention_mask.dtype != query.dtype:
        attention_mask = attention_mask.to(query.dtype)  # SDPA wants the query's dtype (autocast: bf16)
    if eager:
        return eager_attention(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling)
    return gqa_sdpa_attention(
        module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=False, **kwargs
    )


AttentionInterface.register(ATTENTION_NAME, eagle_attention)
