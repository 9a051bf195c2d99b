"""GQA_SDPA (headway/attention.py): on CPU the same numbers as transformers' SDPA with repeated keys,
forward and backward, and a model switched to it gives the same logits and greedy tokens."""

from __future__ import annotations

import pytest
import torch
from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward

from headway.attention import GQA_SDPA, gqa_sdpa_attention, use_gqa_sdpa
from headway.kv import decode_attention
from tests.tiny_models import tiny_llama


class _Module(torch.nn.Module):
    num_key_value_groups = 3
    is_causal = True


def _inputs(q_len, s, dtype, seed=0, bool_mask=False):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 9, q_len, 64, generator=g).to(dtype)
    k = torch.randn(2, 3, s, 64, generator=g).to(dtype)
    v = torch.randn(2, 3, s, 64, generator=g).to(dtype)
    keep = torch.rand(2, 1, q_len, s, generator=g) > 0.3
    keep[..., 0] = True  # no empty softmax row
    mask = keep if bool_mask else torch.zeros(keep.shape, dtype=dtype).masked_fill(~keep, torch.finfo(dtype).min)
    return q, k, v, mask


def _repeated_keys_reference(q, k, v, mask):
    """What transformers' SDPA does with a mask and several queries: copy the keys per query head."""
    out = torch.nn.functional.scaled_dot_product_attention(q, repeat_kv(k, 3), repeat_kv(v, 3), attn_mask=mask)
    return out.transpose(1, 2).contiguous()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("q_len,s", [(1, 40), (5, 40), (17, 300), (64, 64)])
@pytest.mark.parametrize("bool_mask", [False, True])
def test_same_numbers_as_repeated_keys(dtype, q_len, s, bool_mask):
    q, k, v, mask = _inputs(q_len, s, dtype, bool_mask=bool_mask)
    out, _ = gqa_sdpa_attention(_Module(), q, k, v, mask)
    assert out.shape == (2, q_len, 9, 64)
    assert torch.equal(out, _repeated_keys_reference(q, k, v, mask))


def test_gradients_equal_repeated_keys():
    leaves = [t.requires_grad_() for t in _inputs(7, 30, torch.float32)[:3]]
    mask = _inputs(7, 30, torch.float32)[3]
    ours = gqa_sdpa_attention(_Module(), *leaves, mask)[0]
    grads = torch.autograd.grad(ours.square().sum(), leaves)
    ref = _repeated_keys_reference(*leaves, mask)
    ref_grads = torch.autograd.grad(ref.square().sum(), leaves)
    assert torch.equal(ours, ref)
    for a, b in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def test_without_a_mask_it_is_transformers_sdpa():
    """No mask: transformers owns the causal flag (and its key cropping); the call is passed through."""
    q, k, v, _ = _inputs(6, 6, torch.float32)
    ours = gqa_sdpa_attention(_Module(), q, k, v, None)[0]
    assert torch.equal(ours, sdpa_attention_forward(_Module(), q, k, v, None)[0])


def test_a_switched_model_gives_the_same_logits_and_tokens():
    plain, switched = tiny_llama(), tiny_llama()  # 4 query heads over 2 key heads
    assert plain.config._attn_implementation == "sdpa"
    assert use_gqa_sdpa(switched) and switched.config._attn_implementation == GQA_SDPA
    ids = torch.randint(3, 512, (2, 12), generator=torch.Generator().manual_seed(1))
    attn = torch.ones_like(ids)
    attn[1, :4] = 0  # left padding: a real mask reaches the attention
    with torch.inference_mode():
        assert torch.equal(switched(ids, attention_mask=attn).logits, plain(ids, attention_mask=attn).logits)
        kw = dict(attention_mask=attn, max_new_tokens=10, do_sample=False, pad_token_id=2)
        assert torch.equal(switched.generate(ids, **kw), plain.generate(ids, **kw))


def test_eager_models_are_left_alone_and_decode_attention_still_switches():
    eager = tiny_llama(attn_implementation="eager")
    assert not use_gqa_sdpa(eager) and eager.config._attn_implementation == "eager"
    switched = tiny_llama()
    use_gqa_sdpa(switched)
    with decode_attention(switched) as on:
        assert on
    assert switched.config._attn_implementation == GQA_SDPA


def test_the_losslessness_suite_runs_on_gqa_sdpa(smol_fp32):
    """load_target switches the real target, so tests/test_lossless_*.py check the engine through it."""
    assert smol_fp32.config._attn_implementation == GQA_SDPA

