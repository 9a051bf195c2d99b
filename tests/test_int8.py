"""int8 drafter weights (headway/int8.py): close to nn.Linear, a fallback wherever the int8 copy may not
apply, and `inference.draft_quantization: int8` quantising the drafter's own linears, never the target's.
Losslessness with int8 drafters on the real target: tests/test_lossless_eagle3.py and test_lossless_medusa.py."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from headway.config import load_config
from headway.inference.build import load_drafter
from headway.int8 import Int8Linear, int8_available, quantize_linears
from headway.packed import PackedLinear
from tests.tiny_models import tiny_llama

# Tests that run the int8 kernel; the one for a torch without it (the last) runs everywhere.
needs_int8 = pytest.mark.skipif(not int8_available(torch.ones(1)), reason="this torch has no CPU int8 linear")


def _linear(n_in=576, n_out=1536, bias=False, seed=0):
    torch.manual_seed(seed)
    return nn.Linear(n_in, n_out, bias=bias).requires_grad_(False)


@needs_int8
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(1, 576), (8, 576), (3, 7, 576)])
def test_int8_linear_is_close_to_linear(shape, bias):
    lin = _linear(bias=bias)
    x = torch.randn(*shape)
    with torch.inference_mode():
        ref = lin(x)
        assert quantize_linears(lin) == 1 and isinstance(lin, Int8Linear)
        out = lin(x)
    assert out.shape == ref.shape and out.dtype == ref.dtype
    rel = float((out - ref).norm() / ref.norm())
    # 8-bit weights per row and 7-bit activations per call: about 2% on Gaussian data (measured 1.5-2%)
    assert 1e-4 < rel < 0.04, rel


@needs_int8
def test_int8_linear_keeps_the_weight_and_its_dtype():
    lin = _linear().to(torch.bfloat16)
    before = {k: v.clone() for k, v in lin.state_dict().items()}
    quantize_linears(lin)
    assert list(lin.state_dict()) == list(before) and torch.equal(lin.weight, before["weight"])
    with torch.inference_mode():
        assert lin(torch.randn(2, 576, dtype=torch.bfloat16)).dtype == torch.bfloat16


@needs_int8
def test_int8_linear_falls_back_where_the_copy_may_not_apply():
    lin = _linear(bias=True)
    quantize_linears(lin)
    x = torch.randn(4, 576)
    # autograd: the exact op, with a gradient
    xg = x.clone().requires_grad_(True)
    y = lin(xg)
    assert torch.equal(y, nn.functional.linear(xg, lin.weight, lin.bias))
    y.sum().backward()
    assert xg.grad is not None
    # a weight changed after quantising: the new weight, exactly, until quantised again
    with torch.no_grad():
        lin.weight.mul_(2)
    with torch.inference_mode():
        assert torch.equal(lin(x), nn.functional.linear(x, lin.weight, lin.bias))
    lin.quantize()
    with torch.inference_mode():
        assert not torch.equal(lin(x), nn.functional.linear(x, lin.weight, lin.bias))


@needs_int8
def test_packing_leaves_int8_layers_alone():
    from headway.packed import pack_linears, packing_available

    model = nn.Sequential(_linear(), _linear(1536, 576))
    quantize_linears(model[0])
    pack_linears(model)
    assert type(model[0]) is Int8Linear
    assert type(model[1]) is (PackedLinear if packing_available(model[1].weight) else nn.Linear)


def _cfg(recipe: str, *extra: str):
    return load_config(f"configs/smollm2-135m/{recipe}.yaml", ["inference.draft_quantization=int8", *extra])


def _target_linear_types(target) -> set[type]:
    return {type(m) for m in target.modules() if isinstance(m, nn.Linear)}


@needs_int8
@pytest.mark.parametrize("recipe", ["medusa", "eagle3"])
def test_draft_quantization_quantises_only_the_drafter(recipe):
    target = tiny_llama(num_layers=4)
    cfg = _cfg(recipe, "eagle.feature_layers=[1,2,3]") if recipe == "eagle3" else _cfg(recipe)
    drafter, verifier, _, _, notes = load_drafter(cfg, None, target)
    own = drafter.heads if recipe == "medusa" else drafter.drafter
    kinds = {name: type(m) for name, m in own.named_modules() if isinstance(m, nn.Linear)}
    kept = {"fc"} if recipe == "eagle3" else set()  # EAGLE's fc reads un-normed target features
    assert {n for n, k in kinds.items() if k is not Int8Linear} == kept, kinds
    assert Int8Linear not in _target_linear_types(verifier)
    assert any(n.startswith("int8 drafter weights") for n in notes), notes


@needs_int8
def test_layer_skip_is_never_quantised():
    """Its layers are the target's own: quantising them would change the verifier, so the outputs."""
    target = tiny_llama(num_layers=4)
    _, verifier, method, _, notes = load_drafter(_cfg("medusa"), None, target, layer_skip=2)
    assert method == "layer-skip-2"
    assert Int8Linear not in _target_linear_types(verifier)
    assert any("ignored for layer-skip" in n for n in notes), notes


def test_a_torch_without_the_int8_api_quantises_nothing(monkeypatch):
    """torch has deprecated its quantised-tensor API (pytorch#184982). Where it is gone, int8 is off: the
    drafter keeps its weights and the report's notes say why, instead of a crash at load."""
    import headway.int8 as int8

    monkeypatch.delattr(torch, "quantize_per_channel")
    int8._kernel_runs.cache_clear()
    try:
        assert not int8_available(torch.ones(1))
        lin = _linear()
        assert quantize_linears(lin) == 0 and type(lin) is nn.Linear
        drafter, *_, notes = load_drafter(_cfg("medusa"), None, tiny_llama(num_layers=4))
        assert Int8Linear not in {type(m) for m in drafter.heads.modules()}
        assert any("no CPU int8 kernel" in n for n in notes), notes
    finally:
        monkeypatch.undo()
        int8._kernel_runs.cache_clear()
