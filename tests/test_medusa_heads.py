"""Medusa heads and the draft vocabulary: init, vLLM names, save/load, target checks."""

import json

import pytest
import torch
from datasets import Dataset
from tiny_models import tiny_llama

from headway.heads.medusa import MedusaHeads
from headway.heads.vocab import DraftVocab, build_draft_vocab, coverage


def rows_dataset():
    # Token 7 dominates the masked positions; token 9 appears only in prompts (mask 0).
    return Dataset.from_dict(
        {
            "input_ids": [[9, 9, 9, 7, 7, 5, 2], [9, 9, 7, 3, 7, 2]],
            "loss_mask": [[0, 0, 0, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1]],
        }
    )


def test_draft_vocab_counts_masked_tokens_and_maps_both_ways():
    vocab = build_draft_vocab(rows_dataset(), draft_vocab_size=3, target_vocab_size=16)
    # masked counts: 7 x4, 2 x2, then 5 and 3 once each (tie broken by overall count, then id: 3 < 5)
    assert vocab.token_map.tolist() == [2, 3, 7]
    assert vocab.to_target(torch.tensor([0, 1, 2])).tolist() == [2, 3, 7]
    assert vocab.to_draft(torch.tensor([7, 9, 2])).tolist() == [2, -1, 0]
    d2t = vocab.d2t
    assert d2t.dtype == torch.int64 and (torch.arange(3) + d2t).tolist() == [2, 3, 7]
    assert vocab.t2d.dtype == torch.bool and vocab.t2d.nonzero().flatten().tolist() == [2, 3, 7]
    assert DraftVocab.from_d2t(d2t, 16).token_map.tolist() == [2, 3, 7]
    assert coverage(vocab, rows_dataset()) == pytest.approx(7 / 8)


def test_draft_vocab_forced_tokens_and_padding_to_size():
    vocab = build_draft_vocab(rows_dataset(), draft_vocab_size=6, target_vocab_size=16, always_include=[15])
    assert vocab.size == 6 and 15 in vocab.token_map.tolist() and 9 in vocab.token_map.tolist()
    with pytest.raises(ValueError, match="draft_vocab_size"):
        build_draft_vocab(rows_dataset(), draft_vocab_size=17, target_vocab_size=16)
    with pytest.raises(ValueError, match="outside the target vocabulary"):
        build_draft_vocab(rows_dataset(), draft_vocab_size=3, target_vocab_size=8)


def _reduced_heads(target):
    vocab = DraftVocab(torch.tensor([2, 5, 11, 40, 100, 300], dtype=torch.int64), target.config.vocab_size)
    return MedusaHeads.from_target(target, num_heads=3, num_layers=2, vocab=vocab, target_name="tiny"), vocab


def test_fresh_heads_predict_like_the_target_and_carry_vllm_names():
    target = tiny_llama(vocab_size=512, hidden_size=64)
    heads, vocab = _reduced_heads(target)
    names = set(heads.state_dict())
    expected = {f"blocks.{i}.layers.{j}.{p}" for i in range(3) for j in range(2) for p in ("weight", "bias")}
    expected |= {f"lm_heads.{i}.weight" for i in range(3)} | {"token_map"}
    assert names == expected
    ids = torch.randint(0, 512, (2, 9))
    with torch.no_grad():
        out = target(ids, output_hidden_states=True)
        hidden = out.hidden_states[-1]  # after the final norm: what lm_head reads
        logits = heads(hidden)
    assert logits.shape == (3, 2, 9, vocab.size)
    for k in range(3):  # identity blocks + copied rows = the target's logits restricted to the draft vocab
        torch.testing.assert_close(logits[k], out.logits[..., vocab.token_map], rtol=1e-5, atol=1e-5)
    assert heads.to_target_ids(torch.tensor([0, 3])).tolist() == [2, 40]
    assert heads.to_draft_ids(torch.tensor([40, 41])).tolist() == [3, -1]


def test_full_vocab_heads_have_no_token_map():
    target = tiny_llama(vocab_size=128, hidden_size=32)
    heads = MedusaHeads.from_target(target, num_heads=2, num_layers=1)
    assert "token_map" not in heads.state_dict()
    assert heads.to_target_ids(torch.tensor([5])).tolist() == [5]
    assert heads(torch.randn(4, 32)).shape == (2, 4, 128)


def test_save_load_identical_logits_and_vllm_config(tmp_path):
    target = tiny_llama(vocab_size=512, hidden_size=64)
    heads, _ = _reduced_heads(target)
    with torch.no_grad():  # move away from the init so the test sees trained-looking weights
        for p in heads.parameters():
            p.add_(0.05 * torch.randn_like(p))
    heads.save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["model_type"] == "medusa" and cfg["num_heads"] == 3 and cfg["num_hidden_layers"] == 2
    assert cfg["truncated_vocab_size"] == 6 and cfg["vocab_size"] == 512 and cfg["medusa_fc_bias"] is True
    loaded = MedusaHeads.from_pretrained(tmp_path, target=target)
    x = torch.randn(5, 64)
    with torch.no_grad():
        assert torch.equal(heads(x), loaded(x))
    assert torch.equal(loaded.token_map, heads.token_map)
    assert torch.equal(loaded.target_to_draft, heads.target_to_draft)


def test_load_onto_mismatched_target_names_both_values(tmp_path):
    heads, _ = _reduced_heads(tiny_llama(vocab_size=512, hidden_size=64))
    heads.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"hidden_size=64.*hidden_size=32"):
        MedusaHeads.from_pretrained(tmp_path, target=tiny_llama(vocab_size=512, hidden_size=32))
    with pytest.raises(ValueError, match=r"vocab_size=512.*vocab_size=256"):
        MedusaHeads.from_pretrained(tmp_path, target=tiny_llama(vocab_size=256, hidden_size=64))
    with pytest.raises(FileNotFoundError, match="lacks config.json"):
        MedusaHeads.from_pretrained(tmp_path / "nowhere")
