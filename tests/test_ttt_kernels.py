"""The training-time-test attention kernel and the EAGLE-3 loss against their plain-autograd references.

`ttt_attention` (the default) must compute what `ttt_attention_materialised` (every score in memory,
autograd through plain ops) computes, forward and gradients: tightly in fp32; under bf16 autocast, as
close to the fp32 result as the reference is (both round scores and probabilities to bf16).
"""

from __future__ import annotations

import types

import pytest
import torch
from tiny_models import tiny_llama
from train_helpers import synthetic_rows

from headway.data.dataset import collate
from headway.data.features import OnlineFeatures
from headway.heads import eagle_attention
from headway.heads.eagle import Eagle3Drafter
from headway.heads.eagle_attention import causal_mask, ttt_attention, ttt_attention_materialised
from headway.heads.eagle_objective import EagleLossConfig, build_objective
from headway.heads.vocab import DraftVocab

FP32 = dict(rtol=1e-5, atol=1e-5)
BF16_REL = 1.5e-2  # relative (norm) error to the fp32 result allowed under bf16 autocast


def _case(later: int, seed: int = 0):
    """A TTT step: 2 rows (one padded), 6 query heads over 2 key/value heads, anchors gathered for later > 0."""
    g = torch.Generator().manual_seed(seed)
    B, H, KV, T, D = 2, 6, 2, 24, 16
    attn = torch.ones(B, T, dtype=torch.long)
    attn[1, 17:] = 0
    block = causal_mask(attn, torch.float32)
    index = torch.arange(T) if later == 0 else torch.tensor([3, 5, 6, 9, 12, 13, 15])
    Q = index.numel()
    # queries arrive as the attention module makes them: a transposed view of [B, Q, H, D]
    q = torch.randn(B, Q, H, D, generator=g).transpose(1, 2).requires_grad_()
    k = torch.randn(B, KV, T + later * Q, D, generator=g, requires_grad=True)
    v = torch.randn(B, KV, T + later * Q, D, generator=g, requires_grad=True)
    return q, k, v, block[:, :, index].contiguous(), T


def _run(kernel, q, k, v, mask, T, autocast=False):
    module = types.SimpleNamespace(training=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out, _ = kernel(module, q, k, v, mask, T)
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    return (out.float(), *torch.autograd.grad((out.float() * weights).sum(), (q, k, v)))


@pytest.mark.parametrize("later", [0, 1, 3])
def test_ttt_attention_equals_the_materialised_reference_in_fp32(later):
    case = _case(later)
    got, want = _run(ttt_attention, *case), _run(ttt_attention_materialised, *case)
    for name, a, b in zip(("output", "d query", "d key", "d value"), got, want, strict=True):
        torch.testing.assert_close(a, b, **FP32, msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.parametrize("later", [0, 3])
def test_ttt_attention_under_bf16_is_as_close_to_fp32_as_the_reference(later):
    case = _case(later, seed=2)
    exact = _run(ttt_attention_materialised, *case)
    got, ref = _run(ttt_attention, *case, autocast=True), _run(ttt_attention_materialised, *case, autocast=True)
    for name, a, r, e in zip(("output", "d query", "d key", "d value"), got, ref, exact, strict=True):
        err, ref_err = ((a - e).norm() / e.norm()).item(), ((r - e).norm() / e.norm()).item()
        assert err < BF16_REL and err <= 1.25 * ref_err + 1e-3, f"{name}: {err:.2e} (reference {ref_err:.2e})"


def test_attention_dropout_and_eager_use_the_reference(monkeypatch):
    calls = []
    monkeypatch.setattr(eagle_attention, "ttt_attention_materialised", lambda *a, **k: calls.append("reference"))
    monkeypatch.setattr(eagle_attention, "ttt_attention", lambda *a, **k: calls.append("default"))
    q, k, v, mask, T = _case(0)
    for base, training, dropout in [("sdpa", True, 0.0), ("sdpa", False, 0.1), ("sdpa", True, 0.1), ("eager", True, 0.0)]:
        module = types.SimpleNamespace(training=training, config=types.SimpleNamespace(headway_base_attention=base))
        eagle_attention.eagle_attention(module, q, k, v, mask, dropout=dropout, eagle_ttt_block=T)
    assert calls == ["default", "default", "reference", "reference"]


@pytest.fixture(scope="module")
def target():
    return tiny_llama(vocab_size=128, hidden_size=32, num_layers=4, seed=0)


@pytest.mark.parametrize("autocast", [False, True])
def test_eagle3_loss_and_gradients_equal_with_either_kernel(target, autocast):
    """The whole objective (4 unrolled steps, soft CE on a reduced vocabulary) through both kernels."""
    torch.manual_seed(0)
    vocab = DraftVocab(torch.tensor([i for i in range(128) if i % 5 != 4], dtype=torch.int64), 128)
    drafter = Eagle3Drafter.from_target(target, feature_layers=[1, 2, 3], vocab=vocab)
    objective = build_objective(drafter, EagleLossConfig(unroll_steps=4), pad_id=2).train()
    rows = synthetic_rows(2, 128, seed=5, min_len=20, max_len=36)
    batch = collate([rows[i] for i in range(2)], pad_id=2)
    feats = OnlineFeatures(target, objective.feature_spec())(batch)
    params = [p for p in objective.parameters() if p.requires_grad]
    results = {}
    for base in ("sdpa", "eager"):  # eager: the materialised reference kernel
        setattr(drafter.layer_config, eagle_attention.BASE_ATTENTION_ATTR, base)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = objective.training_loss(batch, feats).loss
        results[base] = (loss.detach(), torch.autograd.grad(loss, params))
    (loss, grads), (ref_loss, ref_grads) = results["sdpa"], results["eager"]
    if not autocast:
        torch.testing.assert_close(loss, ref_loss, **FP32)
        for g, r in zip(grads, ref_grads, strict=True):
            torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-5)
        return
    assert abs(loss - ref_loss) / ref_loss < 1e-2
    total = torch.cat([g.flatten() for g in grads])
    ref_total = torch.cat([g.flatten() for g in ref_grads])
    assert (total - ref_total).norm() / ref_total.norm() < 3e-2


def test_bench_ttt_shapes_hand_overrides_on():
    """argparse gives `--shapes` every word after it; recipe overrides there must reach the config, and a
    word that is neither a T:A pair nor an override is refused by name."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / "bench_ttt.py"
    spec = importlib.util.spec_from_file_location("bench_ttt", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    shapes, overrides = bench.split_shapes(["1024:256", "eagle.draft_vocab_size=4096", "256:170"], ["train.lr=1e-3"])
    assert shapes == [(1024, 256), (256, 170)]
    assert overrides == ["train.lr=1e-3", "eagle.draft_vocab_size=4096"]
    with pytest.raises(ValueError, match="1024x256"):
        bench.split_shapes(["1024x256"], [])
    with pytest.raises(ValueError, match="none"):
        bench.split_shapes(["eagle.unroll_steps=3"], [])
