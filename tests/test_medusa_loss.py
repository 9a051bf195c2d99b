"""Medusa-1 label alignment against a brute-force reference, overfitting, and Medusa-2's trainable set."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from tiny_models import tiny_llama
from train_helpers import synthetic_rows

from headway.config import TrainConfig
from headway.data.features import OnlineFeatures
from headway.heads.medusa import MedusaHeads
from headway.heads.medusa_loss import Medusa2Objective, MedusaObjective, medusa_head_targets, medusa_loss
from headway.heads.vocab import DraftVocab
from headway.train.loop import make_accelerator, train

pytestmark = pytest.mark.usefixtures("fresh_accelerate")


def test_head_targets_on_a_hand_example():
    # positions:        0  1  2  3  4  5  6  7  8
    mask = torch.tensor([[0, 0, 1, 1, 1, 0, 0, 1, 1]])
    ids = torch.arange(10, 19)[None]
    (v1, l1), (v2, l2), (v3, _) = medusa_head_targets(ids, mask, 3)
    # head 1 at t needs t+1, t+2 generated; predicts ids[t+2]
    assert v1[0].nonzero().flatten().tolist() == [1, 2, 6]
    assert l1[0, [1, 2, 6]].tolist() == [13, 14, 18]
    # head 2 needs t+1..t+3 generated; predicts ids[t+3]
    assert v2[0].nonzero().flatten().tolist() == [1]
    assert l2[0, 1].item() == 14
    assert not v3.any()


def _brute_force(heads, hidden, ids, mask, decay):
    B, T, _ = hidden.shape
    K = heads.config.num_heads
    total, per_head_top1 = 0.0, []
    for k in range(1, K + 1):
        logits, labels, hits, n = [], [], 0, 0
        for b in range(B):
            for t in range(T):
                if t + k + 1 >= T or not all(mask[b, j] == 1 for j in range(t + 1, t + k + 2)):
                    continue
                lg = heads.lm_heads[k - 1](heads.blocks[k - 1](hidden[b, t]))
                label = heads.to_draft_ids(ids[b, t + k + 1]).item()
                n += 1
                hits += int(label >= 0 and lg.argmax().item() == label)
                if label >= 0:
                    logits.append(lg)
                    labels.append(label)
        ce = F.cross_entropy(torch.stack(logits), torch.tensor(labels)) if labels else torch.tensor(0.0)
        total = total + decay**k * ce
        per_head_top1.append(hits / max(1, n))
    return total, per_head_top1


@pytest.mark.parametrize("reduced", [False, True])
def test_medusa_loss_matches_brute_force(reduced):
    torch.manual_seed(0)
    target = tiny_llama(vocab_size=64, hidden_size=16)
    vocab = DraftVocab(torch.arange(0, 64, 2, dtype=torch.int64), 64) if reduced else None  # odd ids: out of vocab
    heads = MedusaHeads.from_target(target, num_heads=3, num_layers=1, vocab=vocab)
    with torch.no_grad():
        for p in heads.parameters():
            p.add_(0.3 * torch.randn_like(p))
    B, T = 3, 14
    hidden = torch.randn(B, T, 16)
    ids = torch.randint(0, 64, (B, T))
    mask = torch.zeros(B, T, dtype=torch.long)
    mask[0, 3:9] = 1
    mask[0, 11:14] = 1  # second answer after a user turn
    mask[1, 1:12] = 1  # padding after 12
    mask[2, 5:14] = 1
    out = medusa_loss(heads, hidden, ids, mask, decay=0.8)
    ref_loss, ref_top1 = _brute_force(heads, hidden, ids, mask, 0.8)
    torch.testing.assert_close(out.loss, torch.as_tensor(ref_loss, dtype=torch.float32), rtol=1e-5, atol=1e-6)
    for k, acc in enumerate(ref_top1, start=1):
        assert out.metrics[f"head{k}/top1"].item() == pytest.approx(acc)


@pytest.mark.parametrize("s", [0.7, 1.0])
@pytest.mark.parametrize("reduced", [False, True])
def test_soft_labels_match_brute_force(reduced, s):
    """Head k at t learns the target's distribution at t+k (over token t+k+1), restricted to the draft vocabulary;
    loss and gradients alike, through the projected path (heads/soft_ce.py) that training takes."""
    torch.manual_seed(1)
    target = tiny_llama(vocab_size=64, hidden_size=16)
    vocab = DraftVocab(torch.arange(0, 64, 2, dtype=torch.int64), 64) if reduced else None
    heads = MedusaHeads.from_target(target, num_heads=2, num_layers=1, vocab=vocab)
    with torch.no_grad():
        for p in heads.parameters():
            p.add_(0.3 * torch.randn_like(p))
    w = target.get_output_embeddings().weight.detach()
    rows = w[vocab.token_map] if reduced else w
    B, T = 2, 12
    hidden = torch.randn(B, T, 16)
    ids = torch.randint(0, 64, (B, T))
    mask = torch.zeros(B, T, dtype=torch.long)
    mask[0, 2:10] = 1
    mask[1, 4:12] = 1
    out = medusa_loss(heads, hidden, ids, mask, decay=0.8, teacher_rows=rows, soft_label_weight=s)
    total = 0.0
    for k in (1, 2):
        hard, soft = [], []
        for b in range(B):
            for t in range(T - k - 1):
                if not all(mask[b, j] == 1 for j in range(t + 1, t + k + 2)):
                    continue
                label = heads.to_draft_ids(ids[b, t + k + 1]).item()
                if label < 0:
                    continue
                q = heads.lm_heads[k - 1](heads.blocks[k - 1](hidden[b, t])).log_softmax(-1)
                p = torch.softmax(hidden[b, t + k] @ rows.T, -1)  # the target's next-token distribution at t+k
                hard.append(-q[label])
                soft.append(-(p * q).sum())
        ce = (1 - s) * torch.stack(hard).mean() + s * torch.stack(soft).mean()
        total = total + 0.8**k * ce
    torch.testing.assert_close(out.loss, total.float(), rtol=1e-5, atol=1e-6)
    params = list(heads.parameters())
    for got, want in zip(torch.autograd.grad(out.loss, params), torch.autograd.grad(total, params), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)
    assert "head1/top5" not in out.metrics  # training took the projected path: argmax only, no top-5
    hard_only = medusa_loss(heads, hidden, ids, mask, decay=0.8, teacher_rows=rows, soft_label_weight=0.0)
    assert not torch.allclose(hard_only.loss, out.loss)


def test_soft_labels_need_teacher_rows_of_the_heads_shape():
    target = tiny_llama(vocab_size=64, hidden_size=16)
    heads = MedusaHeads.from_target(target, num_heads=2, num_layers=1)
    with pytest.raises(ValueError, match="teacher_rows"):
        MedusaObjective(heads, teacher_rows=torch.zeros(10, 16), soft_label_weight=0.5)
    with pytest.raises(ValueError, match="soft_label_weight"):
        MedusaObjective(heads, soft_label_weight=1.5)
    with pytest.raises(ValueError, match="teacher_rows"):
        medusa_loss(heads, torch.randn(1, 6, 16), torch.zeros(1, 6, dtype=torch.long), torch.ones(1, 6), 0.8,
                    soft_label_weight=0.5)


def _train_cfg(tmp_path, **kw) -> TrainConfig:
    base = dict(
        output_dir=str(tmp_path), batch_size=4, max_steps=40, lr=1e-2, warmup_ratio=0.0, log_every=5,
        eval_every=0, save_every=0, max_seq_len=64, group_by_length=False,
    )
    base.update(kw)
    return TrainConfig(**base)


def _losses(path):
    import json

    rows = [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]
    return [r["train/loss"] for r in rows if r["kind"] == "train"]


def test_loss_falls_when_overfitting_one_batch(tmp_path):
    target = tiny_llama(vocab_size=256, hidden_size=32)
    rows = synthetic_rows(4, 256)
    heads = MedusaHeads.from_target(target, num_heads=3, num_layers=1)
    objective = MedusaObjective(heads)
    cfg = _train_cfg(tmp_path)
    result = train(objective, rows, rows, cfg, make_accelerator(cfg), pad_id=2,
                   feature_source=OnlineFeatures(target, objective.feature_spec()))
    losses = _losses(tmp_path)
    assert losses[-1] < 0.2 * losses[0], losses
    assert result.val_metrics["val/head1/top1"] > 0.8
    assert MedusaHeads.from_pretrained(tmp_path, target=target).config.num_heads == 3


def _medusa2(heads_only_steps):
    from peft import LoraConfig, get_peft_model

    target = tiny_llama(vocab_size=256, hidden_size=32)
    heads = MedusaHeads.from_target(target, num_heads=2, num_layers=1)
    peft_target = get_peft_model(target, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    return Medusa2Objective(peft_target, heads, lam=0.2, heads_only_steps=heads_only_steps, lora_lr_ratio=0.25)


def _snapshot(module):
    return {n: p.detach().clone() for n, p in module.named_parameters()}


@pytest.mark.parametrize("heads_only_steps", [0, 3])
def test_medusa2_steps_change_only_lora_and_heads(tmp_path, heads_only_steps):
    objective = _medusa2(heads_only_steps)
    before = _snapshot(objective)
    rows = synthetic_rows(8, 256)
    cfg = _train_cfg(tmp_path, max_steps=3, lr=1e-2)
    train(objective, rows, rows, cfg, make_accelerator(cfg, find_unused_parameters=True), pad_id=2)
    after = _snapshot(objective)
    changed = {n for n in before if not torch.equal(before[n], after[n])}
    lora = {n for n in before if "lora_" in n}
    head = {n for n in before if n.startswith("heads.")}
    assert changed <= lora | head, f"frozen weights changed: {sorted(changed - lora - head)[:5]}"
    assert head & changed, "the heads did not train"
    if heads_only_steps == 0:
        assert lora & changed, "the adapters did not train"
    else:
        assert not (lora & changed), "adapters trained during the heads-only stage"


def test_medusa2_adapter_saves_beside_heads_and_loads_with_peft(tmp_path):
    from peft import PeftModel

    objective = _medusa2(0)
    rows = synthetic_rows(8, 256)
    cfg = _train_cfg(tmp_path, max_steps=2)
    train(objective, rows, None, cfg, make_accelerator(cfg, find_unused_parameters=True), pad_id=2)
    assert (tmp_path / "model.safetensors").is_file() and (tmp_path / "lora" / "adapter_config.json").is_file()
    reloaded = PeftModel.from_pretrained(tiny_llama(vocab_size=256, hidden_size=32), str(tmp_path / "lora"))
    ids = torch.randint(3, 256, (1, 10))
    objective.eval()
    with torch.no_grad():
        torch.testing.assert_close(reloaded(ids).logits, objective.target(ids).logits)
        # and the adapters really differ from the base model
        assert not torch.allclose(reloaded(ids).logits, tiny_llama(vocab_size=256, hidden_size=32)(ids).logits)


def test_medusa2_validation_kl_is_over_all_positions(tmp_path):
    """Medusa-2's `target/kl` is a mean over the positions whose next token is generated: validation over
    5 rows in batches of 3 and 2 weights each batch by `target/positions`, so it equals the KL summed over
    every row's positions divided by their number, not a mean of the two batches' means."""
    from headway.data.dataset import collate, row_lengths
    from headway.train.data_order import eval_batches

    objective = _medusa2(0)
    rows = synthetic_rows(8, 256)
    val = rows.select(range(5))
    cfg = _train_cfg(tmp_path, max_steps=6, batch_size=3, lr=5e-2)  # enough for a KL well above rounding
    result = train(objective, rows, val, cfg, make_accelerator(cfg, find_unused_parameters=True), pad_id=2)
    objective.eval()
    kl_sums, counts = [], []
    with torch.no_grad():
        for i in range(5):
            m = objective.training_loss(collate([val[i]], pad_id=2, max_len=64), None).metrics
            counts.append(float(m["target/positions"]))
            kl_sums.append(float(m["target/kl"]) * counts[-1])
    want = sum(kl_sums) / sum(counts)
    assert want > 1e-4  # the adapters trained: the tuned target has moved off the frozen one
    # fp32 KL between close distributions: batched and one-row forwards agreed to 7e-6 of it
    assert result.val_metrics["val/target/kl"] == pytest.approx(want, rel=1e-4)
    batches = eval_batches(row_lengths(val, cfg.max_seq_len), 3, 1, 0)
    assert [len(b) for b in batches] == [3, 2]
    old_rule = sum(sum(kl_sums[i] for i in b) / sum(counts[i] for i in b) for b in batches) / 2
    assert abs(old_rule - want) > 1e-3 * want  # the mean of the batches' means would differ: a real test


def test_topk_hits_agree_with_training_metrics():
    from headway.heads.medusa_loss import topk_hits

    torch.manual_seed(1)
    target = tiny_llama(vocab_size=64, hidden_size=16)
    vocab = DraftVocab(torch.arange(0, 64, 2, dtype=torch.int64), 64)
    heads = MedusaHeads.from_target(target, num_heads=2, num_layers=1, vocab=vocab)
    hidden, ids = torch.randn(2, 20, 16), torch.randint(0, 64, (2, 20))
    mask = (torch.rand(2, 20) > 0.2).long()
    metrics = medusa_loss(heads, hidden, ids, mask, 0.8).metrics
    for k, (hits, n) in enumerate(topk_hits(heads, hidden, ids, mask, topk=10), start=1):
        assert n == metrics[f"head{k}/positions"].item() and n > 0
        assert hits[0].item() / n == pytest.approx(metrics[f"head{k}/top1"].item())
        assert hits[4].item() / n == pytest.approx(metrics[f"head{k}/top5"].item())
        assert torch.all(hits[1:] >= hits[:-1])
