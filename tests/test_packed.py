"""Pre-packed bf16 linears (headway/packed.py): the same results as nn.Linear, and a fallback wherever
the packed copy may not apply (autograd, a changed weight, another dtype)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from headway.packed import PackedLinear, pack_linears
from tests.tiny_models import tiny_llama

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="needs oneDNN (mkldnn)")


def _linear(n_in=576, n_out=1536, bias=False, seed=0):
    torch.manual_seed(seed)
    return nn.Linear(n_in, n_out, bias=bias).to(torch.bfloat16).requires_grad_(False)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(1, 576), (8, 576), (25, 576), (3, 7, 576)])
def test_packed_linear_equals_linear_to_the_bit(shape, bias):
    plain = _linear(bias=bias)
    packed = _linear(bias=bias)
    assert pack_linears(packed) == 1 and isinstance(packed, PackedLinear)
    x = torch.randn(*shape, dtype=torch.bfloat16)
    with torch.inference_mode():
        assert torch.equal(packed(x), plain(x))


@pytest.mark.parametrize("n_in,n_out", [(576, 576), (576, 192), (576, 1536), (1536, 576), (576, 49152)])
def test_every_decoding_row_count_is_unchanged(n_in, n_out):
    """SmolLM2-135M's shapes, 1-79 rows (batch-1 decoding, trees, drafts): F.linear's result to the bit."""
    plain = _linear(n_in, n_out)
    packed = _linear(n_in, n_out)
    pack_linears(packed)
    with torch.inference_mode():
        for rows in range(1, 80):
            x = torch.randn(rows, n_in, dtype=torch.bfloat16)
            assert torch.equal(packed(x), plain(x)), f"{rows} rows"


def test_packed_model_logits_equal_unpacked():
    model = tiny_llama(hidden_size=128).to(torch.bfloat16)
    packed = tiny_llama(hidden_size=128).to(torch.bfloat16)
    n = pack_linears(packed)
    assert n == 2 * 7 + 1  # q k v o gate up down per layer, and the lm_head
    assert set(packed.state_dict()) == set(model.state_dict())  # the packed copies are not weights
    ids = torch.randint(3, 512, (2, 19))
    with torch.inference_mode():
        assert torch.equal(packed(ids).logits, model(ids).logits)


def test_a_changed_weight_is_read_not_its_stale_packed_copy():
    lin = _linear()
    pack_linears(lin)
    x = torch.randn(4, 576, dtype=torch.bfloat16)
    with torch.no_grad():
        lin.weight.mul_(2)  # an in-place update (optimizer step, load_state_dict)
    assert torch.equal(lin(x), nn.functional.linear(x, lin.weight))
    lin.to(torch.float32)  # new storage of another dtype
    xf = x.float()
    assert torch.equal(lin(xf), nn.functional.linear(xf, lin.weight))
    lin.to(torch.bfloat16)
    pack_linears(lin)  # re-packing takes the new weight
    assert torch.equal(lin(x), nn.functional.linear(x, lin.weight))


def test_autograd_goes_through_the_plain_op():
    lin, ref = _linear(n_out=64), _linear(n_out=64)
    pack_linears(lin)
    lin.requires_grad_(True)
    ref.requires_grad_(True)
    x = torch.randn(5, 576, dtype=torch.bfloat16, requires_grad=True)
    lin(x).float().square().sum().backward()
    gx, gw = x.grad.clone(), lin.weight.grad.clone()
    x.grad = None
    ref(x).float().square().sum().backward()
    assert torch.equal(gx, x.grad) and torch.equal(gw, ref.weight.grad)


def test_a_packed_layer_moved_off_bf16_is_not_packed_again():
    lin = _linear()
    pack_linears(lin)
    lin.to(torch.float32)
    assert pack_linears(lin) == 0
    x = torch.randn(4, 576)
    assert torch.equal(lin(x), nn.functional.linear(x, lin.weight))


def test_nothing_packed_off_bf16():
    assert pack_linears(tiny_llama()) == 0  # fp32: F.linear is already fast there
