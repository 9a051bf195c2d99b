"""EAGLE drafters: the unrolled training forward against step-by-step drafting, save/load, names, refusals."""

from __future__ import annotations

import json

import pytest
import torch
from tiny_models import tiny_llama

from headway.data.features import OnlineFeatures
from headway.features import FeatureSpec, eagle_feature_spec
from headway.heads.eagle import Eagle1Drafter, Eagle3Drafter, load_drafter
from headway.heads.eagle_attention import offset_causal_mask
from headway.heads.eagle_objective import EagleLossConfig, build_objective
from headway.heads.vocab import DraftVocab

V, H, L = 512, 64, 4


@pytest.fixture(scope="module")
def target():
    return tiny_llama(vocab_size=V, hidden_size=H, num_layers=L, seed=0)


def _vocab():
    return DraftVocab(torch.tensor(sorted(set(range(0, V, 3)) | {2}), dtype=torch.int64), V)


def _drafter(version, target, **kw):
    torch.manual_seed(1)
    if version == 1:
        d = Eagle1Drafter.from_target(target, feature_norm="per_dim", **kw)
    else:
        d = Eagle3Drafter.from_target(
            target, feature_layers=[1, 2, 3], vocab=_vocab(), feature_norm="per_dim", **kw
        )
    with torch.no_grad():  # a non-trivial scale, so its use is exercised
        d.feature_scale.uniform_(0.5, 2.0)
    return d.eval()


def _batch(lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    T = max(lengths)
    ids = torch.full((len(lengths), T), 2, dtype=torch.long)
    attn = torch.zeros(len(lengths), T, dtype=torch.long)
    for b, n in enumerate(lengths):
        ids[b, :n] = torch.randint(3, V, (n,), generator=g)
        attn[b, :n] = 1
    return ids, attn


def _features(drafter, target, ids, attn):
    feats = OnlineFeatures(target, drafter.feature_spec())({"input_ids": ids, "attention_mask": attn})
    return drafter.features_from_target(feats)


@pytest.mark.parametrize("version", [1, 3])
@pytest.mark.parametrize("attn_impl", ["sdpa", "eager"])
def test_unroll_matches_step_by_step_drafting(target, version, attn_impl):
    """Step i at anchor t == drafting from t: prefill 0..t with target features, then i chained steps."""
    d = _drafter(version, target)
    d.layer_config.headway_base_attention = attn_impl
    lengths, steps = [12, 9], 4
    ids, attn = _batch(lengths)
    z = _features(d, target, ids, attn)
    with torch.no_grad():
        unrolled = [d.logits(u.hidden) for u in d.unroll(ids, z, attn, steps, pad_id=2)]
        checked = 0
        for b, n in enumerate(lengths):
            for t in range(0, n - 1):
                cache = d.new_cache()
                # prefill: positions 0..t read token s+1 and the target feature f_s
                out = d.step(ids[b : b + 1, 1 : t + 2], z[b : b + 1, : t + 1], torch.arange(t + 1), cache)
                feat = out.feature[:, -1:]
                torch.testing.assert_close(out.logits[0, -1], unrolled[0][b, t], rtol=1e-4, atol=1e-4)
                for i in range(1, steps):
                    if t + 1 + i >= n:
                        break
                    out = d.step(ids[b : b + 1, t + 1 + i : t + 2 + i], feat, torch.tensor([t + i]), cache)
                    feat = out.feature
                    torch.testing.assert_close(out.logits[0, 0], unrolled[i][b, t], rtol=1e-4, atol=1e-4)
                    checked += 1
    assert checked > 20


@pytest.mark.parametrize("version", [1, 3])
def test_unroll_on_an_anchor_subset_equals_the_full_unroll(target, version):
    """Steps >= 1 on gathered anchors only (the training path) give the full unroll's values there."""
    d = _drafter(version, target)
    ids, attn = _batch([12, 9, 11])
    z = _features(d, target, ids, attn)
    g = torch.Generator().manual_seed(3)
    anchors = (torch.rand(ids.shape, generator=g) < 0.4) & attn.bool()
    anchors[2] = False  # a row without anchors
    with torch.no_grad():
        full = d.unroll(ids, z, attn, 4, pad_id=2)
        part = d.unroll(ids, z, attn, 4, pad_id=2, anchors=anchors)
    assert part[1].hidden.shape[1] == int(anchors.sum(1).max()) < ids.shape[1]
    for i in range(1, 4):
        u = part[i]
        assert int(u.valid.sum()) == int(anchors.sum())
        want = full[i].hidden.gather(1, u.index[..., None].expand(-1, -1, H))[u.valid]
        torch.testing.assert_close(u.hidden[u.valid], want, rtol=1e-5, atol=1e-5)
        assert torch.equal(u.index[u.valid], anchors.nonzero()[:, 1])


def test_unroll_is_not_plain_causal_over_drafted_positions(target):
    """The reference is sensitive: a causal mask over step i's own positions would differ from the chain."""
    d = _drafter(3, target)
    ids, attn = _batch([10])
    z = _features(d, target, ids, attn)
    with torch.no_grad():
        h = [u.hidden for u in d.unroll(ids, z, attn, 2, pad_id=2)]
        # what a naive implementation does: step 1 as an ordinary causal pass over step-0 outputs
        naive = d.step(torch.cat([ids[:, 2:], ids[:, :2]], 1), h[0], torch.arange(10) + 1, d.new_cache())
    assert (d.logits(h[1])[0, 3:8] - naive.logits[0, 3:8]).abs().max() > 1e-3


def test_step_explicit_mask_equals_default_chain(target):
    d = _drafter(3, target)
    ids, attn = _batch([8])
    z = _features(d, target, ids, attn)
    with torch.no_grad():
        a = d.step(ids, z, torch.arange(8), d.new_cache())
        b = d.step(
            ids,
            z,
            torch.arange(8),
            d.new_cache(),
            attention_mask=offset_causal_mask(8, 0, d.dtype, ids.device),
        )
    torch.testing.assert_close(a.logits, b.logits)


@pytest.mark.parametrize("version", [1, 3])
def test_save_load_identical_logits_and_engine_names(tmp_path, target, version):
    d = _drafter(version, target, target_name="tiny")
    ids, attn = _batch([10, 7])
    z = _features(d, target, ids, attn)
    with torch.no_grad():
        before = [d.logits(u.hidden) for u in d.unroll(ids, z, attn, 3, pad_id=2)]
    d.save_pretrained(tmp_path)
    e = load_drafter(tmp_path, target)
    assert type(e) is type(d)
    with torch.no_grad():
        after = [
            e.logits(u.hidden) for u in e.unroll(ids, _features(e, target, ids, attn), attn, 3, pad_id=2)
        ]
    for x, y in zip(before, after, strict=True):
        assert torch.equal(x, y)

    from safetensors import safe_open

    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    mlp = {f"mlp.{p}_proj.weight" for p in ("gate", "up", "down")}
    attn_w = {f"self_attn.{p}_proj.weight" for p in ("q", "k", "v", "o")}
    cfg = json.loads((tmp_path / "config.json").read_text())
    if version == 1:  # vLLM llama_eagle.py: fc without bias, layer 0 without input_layernorm, no embedding
        layer = attn_w | mlp | {"post_attention_layernorm.weight"}
        assert names == {"fc.weight", "feature_scale"} | {f"layers.0.{n}" for n in layer}
        assert cfg["architectures"] == ["EagleLlamaForCausalLM"]
    else:  # vLLM / SGLang llama_eagle3.py
        layer = (
            attn_w
            | mlp
            | {f"{n}.weight" for n in ("hidden_norm", "input_layernorm", "post_attention_layernorm")}
        )
        want = {"fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d", "feature_scale"}
        assert names == want | {f"midlayer.{n}" for n in layer}
        assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["draft_vocab_size"] == _vocab().size
        assert cfg["tie_word_embeddings"] is False and cfg["num_hidden_layers"] == 1
        with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
            assert f.get_tensor("midlayer.self_attn.q_proj.weight").shape == (H, 2 * H)
            assert f.get_tensor("fc.weight").shape == (H, 3 * H)
            assert f.get_tensor("d2t").dtype == torch.int64 and f.get_tensor("t2d").dtype == torch.bool


def test_d2t_t2d_round_trip(tmp_path, target):
    vocab = _vocab()
    d = _drafter(3, target)
    assert torch.equal(d.token_map, vocab.token_map)
    assert torch.equal(d.to_target_ids(torch.arange(vocab.size)), vocab.token_map)
    assert torch.equal(d.t2d, vocab.t2d) and int(d.t2d.sum()) == vocab.size
    d.save_pretrained(tmp_path)
    e = load_drafter(tmp_path, target)
    assert torch.equal(e.d2t, vocab.d2t) and torch.equal(e.t2d, vocab.t2d)
    # the lm_head starts as the target's rows of the draft vocabulary
    torch.testing.assert_close(d.lm_head.weight, target.lm_head.weight[vocab.token_map])


@pytest.mark.parametrize("version", [1, 3])
def test_mismatched_target_refused_naming_both_values(tmp_path, target, version):
    _drafter(version, target, target_name="tiny").save_pretrained(tmp_path)
    other = tiny_llama(vocab_size=V, hidden_size=96, num_layers=L)
    with pytest.raises(ValueError, match=r"hidden_size=64 .*hidden_size=96"):
        load_drafter(tmp_path, other)
    fewer = tiny_llama(vocab_size=V, hidden_size=H, num_layers=L - 1)
    with pytest.raises(ValueError, match=r"num_hidden_layers=4 .*num_hidden_layers=3"):
        load_drafter(tmp_path, fewer)
    bigger_vocab = tiny_llama(vocab_size=V + 64, hidden_size=H, num_layers=L)
    with pytest.raises(ValueError, match=rf"vocab_size={V} .*vocab_size={V + 64}"):
        load_drafter(tmp_path, bigger_vocab)


def test_bad_feature_layers_named(target):
    with pytest.raises(ValueError, match=r"feature_layers \[9\].*1\.\.4"):
        Eagle3Drafter.from_target(target, feature_layers=[1, 2, 9])


def test_drafter_uses_the_targets_own_layer_class():
    """A Qwen2 target gives a Qwen2 decoder layer (q/k/v biases kept), with no model file of ours."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(
        vocab_size=V,
        hidden_size=H,
        intermediate_size=2 * H,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    qwen = Qwen2ForCausalLM(cfg).eval()
    d = Eagle3Drafter.from_target(qwen, feature_layers=[1, 2, 3]).eval()
    assert type(d.midlayer).__name__ == "Qwen2DecoderLayer"
    assert d.midlayer.self_attn.q_proj.bias is not None and d.midlayer.self_attn.q_proj.in_features == 2 * H
    ids, attn = _batch([9])
    z = _features(d, qwen, ids, attn)
    with torch.no_grad():
        out = d.step(ids, z, torch.arange(9), d.new_cache())
    assert out.logits.shape == (1, 9, V) and torch.isfinite(out.logits).all()


def test_feature_spec_layers(target):
    assert Eagle1Drafter.from_target(target).feature_spec() == FeatureSpec(layers=(L - 1,))
    assert Eagle1Drafter.from_target(target, feature_source="post_norm").feature_spec() == FeatureSpec(
        final_normed=True
    )
    # EAGLE-3 reads the *inputs* of layers 1, 2, 3 = outputs of decoder layers 0, 1, 2
    assert Eagle3Drafter.from_target(target, feature_layers=[1, 2, 3]).feature_spec() == FeatureSpec(
        layers=(0, 1, 2)
    )
    # training (objective and cache, from the settings alone): EAGLE-3 adds the target's final normed state
    three = FeatureSpec(layers=(0, 1, 2), final_normed=True)
    assert eagle_feature_spec(3, L, [1, 2, 3], training=True) == three
    assert build_objective(Eagle3Drafter.from_target(target, feature_layers=[1, 2, 3]), EagleLossConfig()).feature_spec() == three
    assert eagle_feature_spec(3, L) == FeatureSpec(layers=(1, 1, 0))  # default [2, L // 2, L - 3] with L = 4
    assert eagle_feature_spec(1, L, training=True) == FeatureSpec(layers=(L - 1,))
    assert build_objective(Eagle1Drafter.from_target(target), EagleLossConfig()).feature_spec() == FeatureSpec(
        layers=(L - 1,)
    )


def test_bf16_cast_keeps_rotary_fp32(target):
    d = _drafter(3, target).to(torch.bfloat16)
    assert d.fc.weight.dtype == torch.bfloat16 and d.rotary_emb.inv_freq.dtype == torch.float32
    assert d.d2t.dtype == torch.int64 and d.t2d.dtype == torch.bool
