"""SDPA that hands grouped-query attention to the kernel on CPU, instead of copying the keys per head.

    from headway.attention import use_gqa_sdpa
    use_gqa_sdpa(model)   # an "sdpa" model now runs GQA_SDPA: same kernel, same numbers, no repeat_kv

transformers' SDPA path copies every cached key and value once per query head of a group
(`repeat_kv`) whenever a mask is given and more than one query comes: a tree verification,
a drafter step, a prefill. torch's CPU kernel takes the grouped keys directly (`enable_gqa`) and
gives the same result to the bit. Measured here (SmolLM2: 9 query heads over 3 key heads, bf16,
one layer's attention over 300 cached keys): 17 queries 318 -> 155 us and 1 query 96 -> 41 us at a
busy hour, 111 -> 77 and 47 -> 18 us at a quiet one; over 30 layers, 1-5 ms of a tree verification (docs/results/2026-12-06-smollm2/gqa-sdpa/).
Elsewhere (CUDA, where a mask with enable_gqa falls back to the math kernel; no mask; softcap,
sinks and the like) it is transformers' own SDPA function, unchanged.
"""

from __future__ import annotations

import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

GQA_SDPA = "headway_gqa_sdpa"


def needs_transformers_kernel(kwargs: dict) -> bool:
    """Whether a call asks for what only transformers' own attention functions do: softcap, sliding
    window, attention sinks, a position bias, or attention weights."""
    special = any(kwargs.get(k) is not None for k in ("softcap", "sliding_window", "s_aux", "position_bias"))
    return special or bool(kwargs.get("output_attentions"))


def gqa_sdpa_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """transformers' attention-function signature: query [B, Hq, Q, D], key/value [B, Hkv, S, D];
    returns [B, Q, Hq, D]."""
    plain = (
        query.device.type != "cpu"
        or attention_mask is None  # transformers' function owns the causal flag and its key cropping
        or query.shape[1] == key.shape[1]
        or needs_transformers_kernel(kwargs)
    )
    if plain:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    out = F.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, enable_gqa=True
    )
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(GQA_SDPA, gqa_sdpa_attention)
AttentionMaskInterface.register(GQA_SDPA, sdpa_mask)  # the masks transformers builds for "sdpa"


def use_gqa_sdpa(model) -> bool:
    """Switch a model on transformers' SDPA to GQA_SDPA (in place). Returns whether it switched."""
    if getattr(model.config, "_attn_implementation", None) != "sdpa":
        return False
    model.set_attn_implementation(GQA_SDPA)
    return True
