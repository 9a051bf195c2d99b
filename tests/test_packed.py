"""Pre-packed linears (headway/packed.py): the same results as nn.Linear, and a fallback wherever the
packed copy may not apply (autograd, a changed weight, another dtype).

Which dtype a CPU packs depends on its oneDNN kernels: bf16 with AVX-512/AMX, fp32 on an AVX2-only CPU.
The tests run in the dtype this machine packs. bf16 packing reuses F.linear's own oneDNN kernel, so it
is compared to the bit; fp32 packing replaces MKL's sgemm, so it is compared within fp32 rounding and,
to the bit, against itself over every row count (what keeps a tree verification's numbers those of a
one-token decode)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from headway.packed import PackedLinear, cpu_has_bf16_kernels, pack_linears
from tests.tiny_models import tiny_llama

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="needs oneDNN (mkldnn)")

DTYPE = torch.bfloat16 if cpu_has_bf16_kernels() else torch.float32  # the dtype this CPU packs
OTHER = torch.float32 if DTYPE == torch.bfloat16 else torch.bfloat16


def assert_same(packed: torch.Tensor, plain: torch.Tensor, what: str = "") -> None:
    if DTYPE == torch.bfloat16:
        assert torch.equal(packed, plain), what
    else:
        torch.testing.assert_close(packed, plain, rtol=1e-5, atol=1e-5, msg=what)


def _linear(n_in=576, n_out=1536, bias=False, seed=0):
    torch.manual_seed(seed)
    return nn.Linear(n_in, n_out, bias=bias).to(DTYPE).requires_grad_(False)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(1, 576), (8, 576), (25, 576), (3, 7, 576)])
def test_packed_linear_equals_linear(shape, bias):
    plain = _linear(bias=bias)
    packed = _linear(bias=bias)
    assert pack_linears(packed) == 1 and isinstance(packed, PackedLinear)
    x = torch.randn(*shape, dtype=DTYPE)
    with torch.inference_mode():
        assert_same(packed(x), plain(x))


@pytest.mark.parametrize("n_in,n_out", [(576, 576), (576, 192), (576, 1536), (1536, 576), (576, 49152)])
def test_every_decoding_row_count_is_unchanged(n_in, n_out):
    """SmolLM2-135M's shapes, 1-79 rows (batch-1 decoding, trees, drafts): F.linear's result; and, where
    packing replaces the kernel (fp32), each row's bits independent of how many rows come with it.

    bf16 packing keeps F.linear's own oneDNN kernel, so it keeps that kernel's row dependence too: on the
    model-167 Xeon (AMX) F.linear gives a row other bits from 33 rows on for these shapes (52 or 68 for
    some), packed or not (docs/results/2026-12-07-smollm2/xeon/bf16_row_dependence.txt)."""
    plain = _linear(n_in, n_out)
    packed = _linear(n_in, n_out)
    pack_linears(packed)
    with torch.inference_mode():
        xs = torch.randn(79, n_in, dtype=DTYPE)
        alone = torch.cat([packed(xs[i : i + 1]) for i in range(79)])
        for rows in range(1, 80):
            x = xs[:rows]
            assert_same(packed(x), plain(x), f"{rows} rows")
            if DTYPE == torch.float32:
                assert torch.equal(packed(x), alone[:rows]), f"{rows} rows"


def test_packed_model_logits_equal_unpacked():
    model = tiny_llama(hidden_size=128).to(DTYPE)
    packed = tiny_llama(hidden_size=128).to(DTYPE)
    n = pack_linears(packed)
    assert n == 2 * 7 + 1  # q k v o gate up down per layer, and the lm_head
    assert set(packed.state_dict()) == set(model.state_dict())  # the packed copies are not weights
    ids = torch.randint(3, 512, (2, 19))
    with torch.inference_mode():
        assert_same(packed(ids).logits, model(ids).logits)


def test_a_changed_weight_is_read_not_its_stale_packed_copy():
    lin = _linear()
    pack_linears(lin)
    x = torch.randn(4, 576, dtype=DTYPE)
    with torch.no_grad():
        lin.weight.mul_(2)  # an in-place update (optimizer step, load_state_dict)
    assert torch.equal(lin(x), nn.functional.linear(x, lin.weight))
    lin.to(OTHER)  # new storage of another dtype
    xo = x.to(OTHER)
    assert torch.equal(lin(xo), nn.functional.linear(xo, lin.weight))
    lin.to(DTYPE)
    pack_linears(lin)  # re-packing takes the new weight
    assert_same(lin(x), nn.functional.linear(x, lin.weight))


def test_autograd_goes_through_the_plain_op():
    lin, ref = _linear(n_out=64), _linear(n_out=64)
    pack_linears(lin)
    lin.requires_grad_(True)
    ref.requires_grad_(True)
    x = torch.randn(5, 576, dtype=DTYPE, requires_grad=True)
    lin(x).float().square().sum().backward()
    gx, gw = x.grad.clone(), lin.weight.grad.clone()
    x.grad = None
    ref(x).float().square().sum().backward()
    assert torch.equal(gx, x.grad) and torch.equal(gw, ref.weight.grad)


def test_a_packed_layer_moved_to_the_other_dtype_is_not_packed_again():
    lin = _linear()
    pack_linears(lin)
    lin.to(OTHER)
    assert pack_linears(lin) == 0
    x = torch.randn(4, 576, dtype=OTHER)
    assert torch.equal(lin(x), nn.functional.linear(x, lin.weight))


def test_nothing_packed_in_the_other_dtype():
    # bf16 without oneDNN bf16 kernels cannot be packed (oneDNN refuses); fp32 beside them was not measured
    assert pack_linears(tiny_llama().to(OTHER)) == 0


@pytest.mark.parametrize("has_bf16_kernels,expected", [(True, torch.bfloat16), (False, torch.float32)])
def test_auto_dtype_on_a_cpu_follows_its_bf16_kernels(monkeypatch, has_bf16_kernels, expected):
    import headway.target

    monkeypatch.setattr(headway.target, "cpu_has_bf16_kernels", lambda: has_bf16_kernels)
    assert headway.target.pick_dtype("auto", torch.device("cpu")) == expected
    assert headway.target.pick_dtype("bfloat16", torch.device("cpu")) == torch.bfloat16  # asked for: given
