"""The shared training loop: exact resume after a kill, NaN stop, data order, features, validation logging."""

from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors.torch import load_file
from tiny_models import tiny_llama
from train_helpers import reset_accelerate, synthetic_rows

from headway.config import TrainConfig
from headway.data.features import BatchFeatures, OnlineFeatures
from headway.features import FeatureSpec, feature_key
from headway.heads.base import LossOutput
from headway.heads.medusa import MedusaHeads
from headway.heads.medusa_loss import MedusaObjective
from headway.train.checkpoint import complete_checkpoints
from headway.train.data_order import DataOrder, eval_batches
from headway.train.loop import NonFiniteLossError, make_accelerator, resolve_mixed_precision, train
from headway.train.optim import cosine_with_warmup

pytestmark = pytest.mark.usefixtures("fresh_accelerate")


def _cfg(out, **kw) -> TrainConfig:
    base = dict(
        output_dir=str(out), batch_size=3, max_steps=6, lr=5e-3, warmup_ratio=0.3, log_every=1,
        eval_every=3, save_every=2, keep_checkpoints=2, max_seq_len=48, grad_accum=2, seed=3,
    )
    base.update(kw)
    return TrainConfig(**base)


def _run(out, target, rows, on_step_end=None, objective=None, **kw):
    heads = MedusaHeads.from_target(target, num_heads=2, num_layers=1)
    objective = objective or MedusaObjective(heads)
    cfg = _cfg(out, **kw)
    return train(objective, rows, rows.select(range(4)), cfg, make_accelerator(cfg), pad_id=2,
                 feature_source=OnlineFeatures(target, FeatureSpec(final_normed=True)), on_step_end=on_step_end)


class _Killed(Exception):
    pass


def test_resume_after_kill_equals_uninterrupted_run(tmp_path):
    target = tiny_llama(vocab_size=128, hidden_size=32)
    rows = synthetic_rows(10, 128)  # 4 micro-batches per epoch, 2 per step: the run crosses epochs
    _run(tmp_path / "straight", target, rows)

    def kill_at_5(step):
        if step == 5:
            raise _Killed  # after step 5, whose checkpoint was never written (save_every=2)

    with pytest.raises(_Killed):
        _run(tmp_path / "killed", target, rows, on_step_end=kill_at_5)
    assert [p.name for p in complete_checkpoints(tmp_path / "killed" / "checkpoints")] == ["step-0000002", "step-0000004"]
    assert not (tmp_path / "killed" / "model.safetensors").exists()
    reset_accelerate()
    result = _run(tmp_path / "killed", target, rows)
    assert result.resumed_from is not None and result.resumed_from.name == "step-0000004"
    a = load_file(tmp_path / "straight" / "model.safetensors")
    b = load_file(tmp_path / "killed" / "model.safetensors")
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=1e-6, msg=k)
    fresh = MedusaHeads.from_target(target, num_heads=2, num_layers=1).state_dict()
    assert not torch.equal(fresh["lm_heads.0.weight"], a["lm_heads.0.weight"]), "nothing trained"
    # checkpoints hold only trainable weights, rotation keeps the newest two
    assert [p.name for p in complete_checkpoints(tmp_path / "straight" / "checkpoints")] == ["step-0000004", "step-0000006"]


class _NanAtStep(MedusaObjective):
    def __init__(self, heads, bad_step):
        super().__init__(heads)
        self.bad_step, self.step = bad_step, 0

    def set_step(self, step):
        self.step = step

    def training_loss(self, batch, feats):
        out = super().training_loss(batch, feats)
        if self.step + 1 == self.bad_step:
            return LossOutput(loss=out.loss * float("nan"), metrics=out.metrics)
        return out


def test_nan_loss_stops_naming_step_and_keeps_last_good_checkpoint(tmp_path):
    target = tiny_llama(vocab_size=128, hidden_size=32)
    rows = synthetic_rows(10, 128)
    objective = _NanAtStep(MedusaHeads.from_target(target, num_heads=2, num_layers=1), bad_step=3)
    with pytest.raises(NonFiniteLossError, match=r"loss is nan at step 3 .*step-0000002"):
        _run(tmp_path, target, rows, objective=objective)
    assert [p.name for p in complete_checkpoints(tmp_path / "checkpoints")] == ["step-0000002"]
    assert not (tmp_path / "model.safetensors").exists()


def test_validation_and_train_metrics_are_logged(tmp_path):
    target = tiny_llama(vocab_size=128, hidden_size=32)
    _run(tmp_path, target, synthetic_rows(10, 128), eval_every=2, save_every=0)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    val = [r for r in rows if r["kind"] == "validation"]
    assert [r["step"] for r in val] == [2, 4, 6]
    assert {"val/head1/top1", "val/head1/top5", "val/head2/loss", "val/loss"} <= set(val[-1])
    train_rows = [r for r in rows if r["kind"] == "train"]
    assert len(train_rows) == 6 and train_rows[0]["train/tokens_per_s"] > 0
    lrs = [r["train/lr_group0"] for r in train_rows]
    assert lrs[1] > lrs[0] and lrs[-1] < max(lrs)  # warm-up, then cosine decay
    summary = json.loads((tmp_path / "train_summary.json").read_text())
    assert summary["step"] == 6 and "val/head1/top1" in summary


def test_validation_accuracy_is_over_all_positions(tmp_path):
    """The 4 validation rows go in batches of 3 and 1: each batch's top-1 counts for its positions, so the
    figure equals the hits over all positions (as head_accuracy scores them), not a mean of batch ratios.
    Over a draft vocabulary of the even ids the loss is a mean over in-vocabulary positions only, and
    counts for those."""
    from headway.data.dataset import collate
    from headway.heads.vocab import DraftVocab

    target = tiny_llama(vocab_size=128, hidden_size=32)
    rows = synthetic_rows(10, 128)
    vocab = DraftVocab(torch.arange(0, 128, 2, dtype=torch.int64), 128)
    objective = MedusaObjective(MedusaHeads.from_target(target, num_heads=2, num_layers=1, vocab=vocab))
    result = _run(tmp_path, target, rows, objective=objective, eval_every=0, save_every=0)
    online = OnlineFeatures(target, FeatureSpec(final_normed=True))
    objective.eval()
    hits, positions, ce_sum, ce_positions = ({1: 0.0, 2: 0.0} for _ in range(4))
    with torch.no_grad():
        for i in range(4):  # one row at a time
            batch = collate([rows[i]], pad_id=2, max_len=48)
            m = objective.training_loss(batch, online(batch)).metrics
            for k in (1, 2):
                n, n_ce = float(m[f"head{k}/positions"]), float(m[f"head{k}/ce_positions"])
                hits[k] += float(m[f"head{k}/top1"]) * n
                positions[k] += n
                ce_sum[k] += float(m[f"head{k}/loss"]) * n_ce
                ce_positions[k] += n_ce
    for k in (1, 2):
        assert 0 < ce_positions[k] < positions[k]  # some labels fall outside the draft vocabulary
        assert result.val_metrics[f"val/head{k}/top1"] == pytest.approx(hits[k] / positions[k], abs=1e-6)
        assert result.val_metrics[f"val/head{k}/loss"] == pytest.approx(ce_sum[k] / ce_positions[k], rel=1e-5)
    assert result.val_metrics["val/head1/positions"] == pytest.approx(positions[1] / 2)  # counts: per batch


def test_train_log_weights_micro_batches_by_positions(tmp_path):
    """Step 1 runs two micro-batches (grad_accum 2) with the initial weights; its logged `train/head1/loss`
    is the cross-entropy over both batches' positions, as validation counts it, not the mean of two means."""
    import copy

    from headway.data.dataset import collate, row_lengths

    target = tiny_llama(vocab_size=128, hidden_size=32)
    rows = synthetic_rows(10, 128)
    objective = MedusaObjective(MedusaHeads.from_target(target, num_heads=2, num_layers=1))
    initial = copy.deepcopy(objective).eval()
    settings = dict(max_steps=1, eval_every=0, save_every=0)
    cfg = _cfg(tmp_path, **settings)  # the settings _run trains with: the batches below are its batches
    _run(tmp_path, target, rows, objective=objective, **settings)
    logged = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    step1 = next(r for r in logged if r["kind"] == "train" and r["step"] == 1)
    batches = DataOrder(row_lengths(rows, cfg.max_seq_len), cfg.batch_size, 1, 0, cfg.seed).batches(0)[:2]
    online = OnlineFeatures(target, FeatureSpec(final_normed=True))
    ce_sum, positions, means = 0.0, 0.0, []
    with torch.no_grad():
        for idx in batches:
            batch = collate([rows[i] for i in idx], pad_id=2, max_len=cfg.max_seq_len)
            m = initial.training_loss(batch, online(batch)).metrics
            ce_sum += float(m["head1/loss"]) * float(m["head1/positions"])
            positions += float(m["head1/positions"])
            means.append(float(m["head1/loss"]))
    assert step1["train/head1/loss"] == pytest.approx(ce_sum / positions, rel=1e-5)
    assert abs(sum(means) / 2 - ce_sum / positions) > 1e-3  # the batches differ: the test tells the rules apart


def test_data_order_splits_ranks_and_is_deterministic():
    lengths = [5 + (i * 7) % 23 for i in range(21)]
    r0 = DataOrder(lengths, batch_size=2, world_size=2, rank=0, seed=1)
    r1 = DataOrder(lengths, batch_size=2, world_size=2, rank=1, seed=1)
    b0, b1 = r0.batches(0), r1.batches(0)
    assert len(b0) == len(b1) == 6  # ceil(21 / 4), the last global batch wraps around
    seen0 = {i for b in b0 for i in b}
    seen1 = {i for b in b1 for i in b}
    assert seen0 | seen1 == set(range(21))
    assert len(seen0 & seen1) <= 3  # only the wrapped-around rows may repeat
    assert r0.batches(0) == b0 and r0.batches(1) != b0  # same epoch: same order; next epoch: new order
    # length grouping: rows in a batch have similar lengths
    spread = [max(lengths[i] for i in b) - min(lengths[i] for i in b) for b in b0]
    assert sum(spread) / len(spread) < 8


@pytest.mark.parametrize("n_rows", [1, 4, 7, 12])
def test_eval_batches_hold_every_row_once_in_step_across_ranks(n_rows):
    lengths = [(i * 7) % 11 + 1 for i in range(n_rows)]
    per_rank = [eval_batches(lengths, batch_size=3, world_size=2, rank=r) for r in (0, 1)]
    assert len(per_rank[0]) == len(per_rank[1])  # the same number of forwards on every rank
    rows = [i for batches in per_rank for b in batches for i in b]
    assert sorted(rows) == list(range(n_rows))  # no wrap-around: no row twice, none left out
    assert all(len(b) <= 3 for batches in per_rank for b in batches)


def test_cosine_schedule_shape():
    vals = [cosine_with_warmup(s, total=20, warmup=5) for s in range(20)]
    assert vals[0] < vals[4] <= 1.0 and vals[5] == pytest.approx(1.0) and vals[-1] < 0.05
    assert cosine_with_warmup(3, total=20, warmup=2, start=5) == 0.0


def test_online_features_hook_layers_and_match_hidden_states():
    model = tiny_llama(vocab_size=128, hidden_size=32, num_layers=3)
    ids = torch.randint(0, 128, (2, 7))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    feats = OnlineFeatures(model, FeatureSpec(layers=(0, 2), final_normed=True, logits=True))(batch)
    with torch.no_grad():
        ref = model(ids, output_hidden_states=True)
    torch.testing.assert_close(feats.layers[0], ref.hidden_states[1])
    torch.testing.assert_close(feats.final_normed, ref.hidden_states[-1])
    torch.testing.assert_close(feats.logits, ref.logits)
    # the last layer's pre-norm output: the final norm of it is what output_hidden_states shows
    torch.testing.assert_close(model.model.norm(feats.layers[2]), ref.hidden_states[-1])
    # only layers: the forward stops early, and no logits are made
    only = OnlineFeatures(model, FeatureSpec(layers=(1,)))(batch)
    assert only.final_normed is None and only.logits is None
    torch.testing.assert_close(only.layers[1], ref.hidden_states[2])
    with pytest.raises(ValueError, match="layer 3 does not exist"):
        OnlineFeatures(model, FeatureSpec(layers=(3,)))


def test_cached_features_carried_in_the_batch_train_identically(tmp_path):
    """A collate that puts precomputed features in the batch gives the same run as online extraction."""
    target = tiny_llama(vocab_size=128, hidden_size=32)
    rows = synthetic_rows(8, 128)
    online = OnlineFeatures(target, FeatureSpec(final_normed=True))
    cache = {}
    for i in range(len(rows)):  # per-row cache, as an offline feature cache would store it
        ids = torch.tensor([rows[i]["input_ids"][:48]])
        cache[i] = online({"input_ids": ids, "attention_mask": torch.ones_like(ids)}).final_normed[0]

    from headway.data.dataset import default_collate

    base_collate = default_collate(2, 48)

    def cached_collate(batch_rows):
        batch = base_collate(batch_rows)
        T = batch["input_ids"].shape[1]
        feats = torch.zeros(len(batch_rows), T, 32)
        for j, r in enumerate(batch_rows):
            f = cache[r["row_index"]]
            feats[j, : f.shape[0]] = f
        batch[feature_key("final_normed")] = feats
        return batch

    results = {}
    for name, source, coll in (("online", online, None), ("cached", BatchFeatures(FeatureSpec(final_normed=True)), cached_collate)):
        reset_accelerate()
        cfg = _cfg(tmp_path / name, max_steps=3, eval_every=0, save_every=0, grad_accum=1)
        heads = MedusaHeads.from_target(target, num_heads=2, num_layers=1)
        train(MedusaObjective(heads), rows, None, cfg, make_accelerator(cfg), pad_id=2,
              feature_source=source, collate_fn=coll)
        results[name] = load_file(tmp_path / name / "model.safetensors")
    for k in results["online"]:
        torch.testing.assert_close(results["online"][k], results["cached"][k], rtol=1e-4, atol=1e-5)


def test_bf16_mixed_precision_trains_fp32_master_weights(tmp_path):
    target = tiny_llama(vocab_size=128, hidden_size=32)
    result = _run(tmp_path, target, synthetic_rows(8, 128), mixed_precision="bf16", max_steps=3, save_every=0, eval_every=0)
    saved = load_file(tmp_path / "model.safetensors")
    assert saved["lm_heads.0.weight"].dtype == torch.float32
    assert result.val_metrics, "the final evaluation reported nothing"
    assert all(math.isfinite(v) for v in result.val_metrics.values()), result.val_metrics
    fresh = MedusaHeads.from_target(target, num_heads=2, num_layers=1).state_dict()
    assert not torch.equal(fresh["blocks.0.layers.0.weight"], saved["blocks.0.layers.0.weight"])


@pytest.mark.parametrize("bf16_kernels,expected", [(True, "bf16"), (False, "no")])
def test_auto_mixed_precision_on_a_cpu_follows_its_bf16_kernels(monkeypatch, bf16_kernels, expected):
    import headway.train.loop as loop

    monkeypatch.setattr(loop, "cpu_has_bf16_kernels", lambda: bf16_kernels)
    assert resolve_mixed_precision("auto", cpu=True) == expected
    assert resolve_mixed_precision("bf16", cpu=True) == "bf16"  # asked for: given, fast or not
    reset_accelerate()
    assert make_accelerator(TrainConfig(mixed_precision="auto"), device="cpu").mixed_precision == expected
    reset_accelerate()


def test_wandb_tracker_runs_offline_without_login(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    target = tiny_llama(vocab_size=128, hidden_size=32)
    _run(tmp_path / "run", target, synthetic_rows(6, 128), report_to="wandb", max_steps=2, save_every=0, eval_every=0)
    runs = list((tmp_path / "run" / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(runs) == 1 and runs[0].stat().st_size > 0
