"""Exported folders computed the way the engines' model code computes them give headway's draft logits.

No vLLM or SGLang here (CPU, no CUDA), so the engines' forward passes are written out below from their
model files (vLLM medusa.py, llama_eagle.py, llama_eagle3.py; SGLang llama_eagle.py, llama_eagle3.py; the
commits are in export/engine_keys.py), reading only the exported config.json and model.safetensors by the
engines' names: fused add-norms, where the residual goes, which norm feeds the logits, the fc bias,
d2t scattering, the aux-layer ids of each engine. The target supplies what the engines share from it
(embedding, EAGLE-1's lm_head, rotary embedding, hidden states).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from tiny_models import tiny_llama
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from headway.data.features import OnlineFeatures
from headway.export.folders import export
from headway.heads.eagle import Eagle1Drafter, Eagle3Drafter
from headway.heads.medusa import MedusaHeads
from headway.heads.vocab import DraftVocab

V, H, L = 512, 64, 8  # EAGLE-3's default layers [2, 4, 5] (with 5 layers they would repeat: refused)
VOCAB = DraftVocab(torch.tensor(sorted(set(range(1, V, 4)) | {2}), dtype=torch.int64), V)


@pytest.fixture(scope="module")
def target():
    return tiny_llama(vocab_size=V, hidden_size=H, num_layers=L, seed=3)


def _randomize(module, seed=11):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.1 + (1.0 if p.dim() == 1 else 0.0))


def _read(folder: Path) -> tuple[dict, dict]:
    return json.loads((folder / "config.json").read_text()), load_file(str(folder / "model.safetensors"))


def _rms(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _attention(x, w, prefix, cfg, target, positions):
    """Llama attention (causal, GQA, rotary) from the folder's q/k/v/o weights."""
    B, T, _ = x.shape
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d = cfg.get("head_dim") or cfg["hidden_size"] // nh
    q = F.linear(x, w[f"{prefix}.q_proj.weight"]).view(B, T, nh, d).transpose(1, 2)
    k = F.linear(x, w[f"{prefix}.k_proj.weight"]).view(B, T, nkv, d).transpose(1, 2)
    v = F.linear(x, w[f"{prefix}.v_proj.weight"]).view(B, T, nkv, d).transpose(1, 2)
    cos, sin = target.model.rotary_emb(x, positions[None].expand(B, -1))
    q, k = apply_rotary_pos_emb(q, k, cos, sin)
    k, v = k.repeat_interleave(nh // nkv, 1), v.repeat_interleave(nh // nkv, 1)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return F.linear(out.transpose(1, 2).reshape(B, T, nh * d), w[f"{prefix}.o_proj.weight"])


def _mlp(x, w, prefix):
    gate, up = F.linear(x, w[f"{prefix}.gate_proj.weight"]), F.linear(x, w[f"{prefix}.up_proj.weight"])
    return F.linear(F.silu(gate) * up, w[f"{prefix}.down_proj.weight"])


def engine_eagle1(folder, target, tokens, features, positions, engine):
    """llama_eagle.py: fc(cat(embed, feature)) (+ bias on SGLang); layer 0 without input norm; out = h + residual;
    logits = the target's lm_head(out), no norm. Returns (logits over V, the fed-back feature)."""
    cfg, w = _read(folder)
    eps = cfg["rms_norm_eps"]
    x = F.linear(
        torch.cat([target.model.embed_tokens(tokens), features], -1), w["fc.weight"], w.get("fc.bias")
    )
    assert (engine == "sglang") == ("fc.bias" in w)
    residual = x  # input_layernorm is the identity on layer 0
    residual = _attention(x, w, "layers.0.self_attn", cfg, target, positions) + residual
    out = (
        _mlp(_rms(residual, w["layers.0.post_attention_layernorm.weight"], eps), w, "layers.0.mlp") + residual
    )
    return target.lm_head(out), out


def engine_eagle3_aux_ids(cfg: dict, engine: str, num_layers: int) -> list[int]:
    """The target layers whose inputs the engine captures (transformers' hidden_states[i]), in the order it
    concatenates them: both capture inside the loop over decoder layers, i.e. in layer order."""
    ids = [2, num_layers // 2, num_layers - 3]
    if engine == "vllm" and cfg.get("eagle_aux_hidden_state_layer_ids"):
        ids = list(cfg["eagle_aux_hidden_state_layer_ids"])
    nested = (cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if engine == "sglang" and nested:
        ids = [i + 1 for i in nested]  # SGLang captures the output of layer i, i.e. the input of layer i + 1
        assert max(ids) < num_layers  # the input of layer L does not exist: never captured
    return [i for i in range(num_layers + 1) if i in ids]


def engine_eagle3(folder, target, tokens, hidden, positions):
    """llama_eagle3.py: residual = hidden; attention on cat(input_layernorm(embed), hidden_norm(hidden));
    fused add-norms; logits = lm_head(norm(out + residual)) scattered to target ids by d2t (-inf elsewhere);
    fed back: out + residual before the norm. `hidden` is fc(aux states) at target positions."""
    cfg, w = _read(folder)
    eps = cfg["rms_norm_eps"]
    embeds = _rms(target.model.embed_tokens(tokens), w["midlayer.input_layernorm.weight"], eps)
    x = torch.cat([embeds, _rms(hidden, w["midlayer.hidden_norm.weight"], eps)], -1)
    residual = _attention(x, w, "midlayer.self_attn", cfg, target, positions) + hidden
    out = _mlp(_rms(residual, w["midlayer.post_attention_layernorm.weight"], eps), w, "midlayer.mlp")
    prenorm = out + residual
    draft = F.linear(_rms(prenorm, w["norm.weight"], eps), w["lm_head.weight"])
    if "d2t" not in w:  # vLLM: no draft_id_to_target_id (>= 0.31) or a zero one; SGLang: no hot_token_id
        assert cfg["draft_vocab_size"] == cfg["vocab_size"] and "t2d" not in w
        return draft, prenorm
    full = draft.new_full((*draft.shape[:-1], cfg["vocab_size"]), float("-inf"))
    full[..., torch.arange(cfg["draft_vocab_size"]) + w["d2t"]] = draft
    return full, prenorm


def _to_full(logits, token_map):
    full = logits.new_full((*logits.shape[:-1], V), float("-inf"))
    full[..., token_map] = logits
    return full


def _ids(n=9):
    return torch.randint(3, V, (2, n), generator=torch.Generator().manual_seed(5))


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
@pytest.mark.parametrize(
    "layers,vocab",
    [([1, 3, 4], VOCAB), (None, VOCAB), ([4, 1, 3], VOCAB), ([1, 3, 4], None)],
    ids=["layers", "default", "unordered", "full-vocab"],
)
def test_eagle3_as_the_engines_compute_it(tmp_path, target, engine, layers, vocab):
    """Also layers listed out of order (fc's blocks permuted into layer order) and V' = V (no d2t)."""
    torch.manual_seed(0)
    d = Eagle3Drafter.from_target(target, feature_layers=layers, vocab=vocab, feature_norm="per_dim")
    _randomize(d)
    with torch.no_grad():
        d.feature_scale.uniform_(0.5, 2.0)
    d.eval().save_pretrained(tmp_path / "ckpt")
    export(tmp_path / "ckpt", engine, tmp_path / "out")
    cfg, w = _read(tmp_path / "out")
    assert ("d2t" in w) == ("t2d" in w) == (vocab is not None)

    ids = _ids()
    T = ids.shape[1] - 1
    with torch.no_grad():
        states = target(ids, output_hidden_states=True).hidden_states
        aux = torch.cat([states[i] for i in engine_eagle3_aux_ids(cfg, engine, L)], -1)
        fused = F.linear(aux, w["fc.weight"])  # combine_hidden_states / fc on target states only
        ref, prenorm = engine_eagle3(tmp_path / "out", target, ids[:, 1:], fused[:, :T], torch.arange(T))
        feats = OnlineFeatures(target, d.feature_spec())(
            {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        )
        cache = d.new_cache()
        step = d.step(ids[:, 1:], d.features_from_target(feats)[:, :T], torch.arange(T), cache)
        torch.testing.assert_close(_to_full(step.logits, d.token_map), ref, rtol=1e-5, atol=1e-5)
        # a second draft step feeds the pre-norm output back, without fc
        nxt = d.to_target_ids(step.logits[:, -1:].argmax(-1))
        ref2, _ = engine_eagle3(
            tmp_path / "out",
            target,
            torch.cat([ids[:, 1:], nxt], 1),
            torch.cat([fused[:, :T], prenorm[:, -1:]], 1),
            torch.arange(T + 1),
        )
        step2 = d.step(nxt, step.feature[:, -1:], torch.tensor([T]), cache)
        torch.testing.assert_close(
            _to_full(step2.logits, d.token_map)[:, -1], ref2[:, -1], rtol=1e-5, atol=1e-5
        )


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_eagle1_as_the_engines_compute_it(tmp_path, target, engine):
    torch.manual_seed(0)
    d = Eagle1Drafter.from_target(target, feature_source="post_norm")
    _randomize(d)
    d.eval().save_pretrained(tmp_path / "ckpt")
    export(tmp_path / "ckpt", engine, tmp_path / "out")
    ids = _ids()
    T = ids.shape[1] - 1
    with torch.no_grad():
        normed = target(ids, output_hidden_states=True).hidden_states[-1]  # what the engines feed EAGLE-1
        ref, out = engine_eagle1(tmp_path / "out", target, ids[:, 1:], normed[:, :T], torch.arange(T), engine)
        feats = OnlineFeatures(target, d.feature_spec())(
            {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        )
        cache = d.new_cache()
        step = d.step(ids[:, 1:], d.features_from_target(feats)[:, :T], torch.arange(T), cache)
        torch.testing.assert_close(step.logits, ref, rtol=1e-5, atol=1e-5)
        nxt = step.logits[:, -1:].argmax(-1)
        ref2, _ = engine_eagle1(
            tmp_path / "out",
            target,
            torch.cat([ids[:, 1:], nxt], 1),
            torch.cat([normed[:, :T], out[:, -1:]], 1),
            torch.arange(T + 1),
            engine,
        )
        step2 = d.step(nxt, step.feature[:, -1:], torch.tensor([T]), cache)
        torch.testing.assert_close(step2.logits[:, -1], ref2[:, -1], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("vocab,version", [(VOCAB, "0.11"), (None, "0.32")], ids=["reduced-0.11", "full-0.32"])
def test_medusa_as_vllm_computes_it(tmp_path, target, vocab, version):
    """medusa.py: x + SiLU(layer(x)) per layer, lm_heads.i, logits scattered to token_map ids (-inf elsewhere)
    when truncated_vocab_size < vocab_size (vLLM <= 0.11 only); full-vocabulary heads as they are."""
    torch.manual_seed(0)
    heads = MedusaHeads.from_target(target, 3, 2, vocab=vocab)
    _randomize(heads)
    heads.eval().save_pretrained(tmp_path / "ckpt")
    export(tmp_path / "ckpt", "vllm", tmp_path / "out", engine_version=version)
    cfg, w = _read(tmp_path / "out")
    reduced = cfg["truncated_vocab_size"] < cfg["vocab_size"]
    assert reduced == (vocab is not None) == ("token_map" in w)
    with torch.no_grad():
        hidden = target(_ids(), output_hidden_states=True).hidden_states[-1]
        ours = heads(hidden)
        for i in range(cfg["num_heads"]):
            x = hidden
            for j in range(cfg["num_hidden_layers"]):
                bias = w[f"blocks.{i}.layers.{j}.bias"] if cfg.get("medusa_fc_bias") else None
                x = x + F.silu(F.linear(x, w[f"blocks.{i}.layers.{j}.weight"], bias))
            ref = F.linear(x, w[f"lm_heads.{i}.weight"])
            if reduced:
                torch.testing.assert_close(_to_full(ours[i], heads.token_map), _to_full(ref, w["token_map"]))
            else:
                torch.testing.assert_close(ours[i], ref)
