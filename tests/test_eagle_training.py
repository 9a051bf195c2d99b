"""EAGLE objectives: alignment and loss against brute force, overfitting, resume through the shared loop."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file
from tiny_models import tiny_llama
from train_helpers import reset_accelerate, synthetic_rows

from headway.config import TrainConfig
from headway.data.dataset import collate
from headway.data.features import OnlineFeatures
from headway.heads.base import count_key
from headway.heads.eagle import Eagle1Drafter, Eagle3Drafter
from headway.heads.eagle_objective import EagleLossConfig, align_step, build_objective
from headway.heads.vocab import DraftVocab
from headway.train.checkpoint import complete_checkpoints
from headway.train.loop import make_accelerator, train

V, H, L = 128, 32, 4


pytestmark = pytest.mark.usefixtures("fresh_accelerate")


@pytest.fixture(scope="module")
def target():
    return tiny_llama(vocab_size=V, hidden_size=H, num_layers=L, seed=0)


def _vocab():  # leaves some answer tokens out, so the out-of-vocabulary masking is exercised
    return DraftVocab(torch.tensor([i for i in range(V) if i % 5 != 4], dtype=torch.int64), V)


def _objective(version, target, steps=3, norm="per_dim", **loss):
    torch.manual_seed(0)
    if version == 1:
        d = Eagle1Drafter.from_target(target, feature_norm=norm)
    else:
        d = Eagle3Drafter.from_target(target, feature_layers=[1, 2, 3], vocab=_vocab(), feature_norm=norm)
    if norm == "per_dim":
        with torch.no_grad():
            d.feature_scale.uniform_(0.5, 2.0)
    return build_objective(d, EagleLossConfig(unroll_steps=steps, **loss), pad_id=2)


def test_align_step_on_a_hand_example():
    ids = torch.tensor([[10, 11, 12, 13, 14, 15, 16, 2]])
    lm = torch.tensor([[0, 0, 1, 1, 1, 0, 1, 1]])  # prompt, answer 12..14, user token 15, answer 16, eos
    batch = {"input_ids": ids, "loss_mask": lm, "attention_mask": torch.ones_like(ids)}
    a0, a1 = align_step(batch, 0), align_step(batch, 1)
    # step 0 at t reads token t+1, predicts t+2; counts when t+1 and t+2 are generated
    assert a0.mask[0].nonzero().flatten().tolist() == [1, 2, 5]
    assert a0.input_ids[0, 1] == 12 and a0.labels[0, 1] == 13 and a0.labels[0, 5] == 2
    # step 1 at t reads token t+2, predicts t+3: tokens t+1..t+3 generated
    assert a1.mask[0].nonzero().flatten().tolist() == [1]
    assert a1.input_ids[0, 1] == 13 and a1.labels[0, 1] == 14 and a1.target_position[0, 1] == 3


@pytest.mark.parametrize("version", [1, 3])
def test_feature_alignment_against_brute_force(target, version):
    """f_t with token t+1 predicts token t+2: each counted pair against the target run on the prefix alone."""
    obj = _objective(version, target)
    d = obj.drafter
    rows = synthetic_rows(3, V, seed=4, min_len=8, max_len=14)
    batch = collate([rows[i] for i in range(3)], pad_id=2)
    feats = OnlineFeatures(target, obj.feature_spec())(batch)
    raw = d.raw_target_features(feats)
    al = align_step(batch, 0)
    checked = 0
    with torch.no_grad():
        for b, t in al.mask.nonzero().tolist():
            assert al.input_ids[b, t] == batch["input_ids"][b, t + 1]
            assert al.labels[b, t] == batch["input_ids"][b, t + 2]
            # the input feature f_t: the target's state at t given tokens 0..t only
            prefix = batch["input_ids"][b : b + 1, : t + 1]
            ref = target(prefix, output_hidden_states=True)
            if version == 1:  # pre-norm last layer: the final norm of it is hidden_states[-1]
                torch.testing.assert_close(
                    target.model.norm(raw[b, t]), ref.hidden_states[-1][0, -1], rtol=1e-4, atol=1e-5
                )
            else:  # inputs of layers 1, 2, 3
                want = torch.cat([ref.hidden_states[i][0, -1] for i in (1, 2, 3)])
                torch.testing.assert_close(raw[b, t], want, rtol=1e-4, atol=1e-5)
            # the training target: the target's distribution over token t+2, from tokens 0..t+1
            full = target(batch["input_ids"][b : b + 1, : t + 2]).logits[0, -1]
            pos = int(al.target_position[b, t])
            if version == 1:
                got = d.target_logits(raw[b, pos])
                torch.testing.assert_close(got, full, rtol=1e-4, atol=1e-4)
            else:
                got = obj.draft_vocab_target_logits(feats.final_normed[b, pos])
                torch.testing.assert_close(got, full[d.token_map], rtol=1e-4, atol=1e-4)
            checked += 1
    assert checked > 10


def test_eagle3_loss_equals_brute_force_step_by_step(target):
    """sum_i 0.8^i CE over step-by-step drafting from every anchor, out-of-vocabulary labels masked."""
    steps = 3
    obj = _objective(3, target, steps=steps).eval()
    d = obj.drafter
    rows = synthetic_rows(2, V, seed=7, min_len=10, max_len=16)
    batch = collate([rows[i] for i in range(2)], pad_id=2)
    feats = OnlineFeatures(target, obj.feature_spec())(batch)
    with torch.no_grad():
        out = obj.training_loss(batch, feats)
        z = d.features_from_target(feats)
        ids, lm = batch["input_ids"], batch["loss_mask"]
        ce = {i: [] for i in range(steps)}
        hits = {i: [] for i in range(steps)}
        for b in range(ids.shape[0]):
            n = int(batch["attention_mask"][b].sum())
            for t in range(n - 2):
                cache = d.new_cache()
                o = d.step(ids[b : b + 1, 1 : t + 2], z[b : b + 1, : t + 1], torch.arange(t + 1), cache)
                logits, feat = o.logits[0, -1], o.feature[:, -1:]
                for i in range(steps):
                    if t + 1 + i >= n:
                        break
                    if i:
                        o = d.step(ids[b : b + 1, t + 1 + i : t + 2 + i], feat, torch.tensor([t + i]), cache)
                        logits, feat = o.logits[0, 0], o.feature
                    if t + 2 + i >= n or not all(lm[b, t + 1 : t + 3 + i]):
                        continue
                    label = int(ids[b, t + 2 + i])
                    hits[i].append(int(d.to_target_ids(logits.argmax())) == label)
                    if not d.t2d[label]:
                        continue
                    p = torch.softmax(target(ids[b : b + 1, : t + 2 + i]).logits[0, -1][d.token_map], -1)
                    ce[i].append(-(p * torch.log_softmax(logits, -1)).sum())
    assert all(len(ce[i]) > 3 for i in range(steps)) and len(hits[0]) > len(ce[0])  # some labels out of vocab
    want = sum(0.8**i * torch.stack(ce[i]).mean() for i in range(steps))
    torch.testing.assert_close(out.loss, want, rtol=1e-4, atol=1e-4)
    for i in range(steps):
        torch.testing.assert_close(
            out.metrics[f"ce_step{i + 1}"], torch.stack(ce[i]).mean(), rtol=1e-4, atol=1e-4
        )
        assert out.metrics[f"pairs_step{i + 1}"] == len(hits[i])
        assert out.metrics[f"acc_step{i + 1}"].item() == pytest.approx(sum(hits[i]) / len(hits[i]))
        assert count_key(f"acc_step{i + 1}") == f"pairs_step{i + 1}"  # what validation weights it by
        assert out.metrics[f"ce_pairs_step{i + 1}"] == len(ce[i])  # the CE is over in-vocabulary pairs only
        assert count_key(f"ce_step{i + 1}") == f"ce_pairs_step{i + 1}"


def distilled_batch(target, n=4, prompt_len=6, answer_len=24, seed=0):
    """Rows the target itself answered greedily: its own next tokens are the labels, as in real training."""
    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(3, V, (n, prompt_len), generator=g)
    with torch.no_grad():
        seqs = target.generate(
            prompts,
            attention_mask=torch.ones_like(prompts),
            max_new_tokens=answer_len,
            min_new_tokens=answer_len,
            do_sample=False,
            pad_token_id=2,
        )
    loss_mask = torch.zeros_like(seqs)
    loss_mask[:, prompt_len:] = 1
    return {"input_ids": seqs, "attention_mask": torch.ones_like(seqs), "loss_mask": loss_mask}


@pytest.mark.parametrize("version", [1, 3])
def test_loss_falls_when_overfitting_one_batch(target, version):
    obj = _objective(version, target, steps=3).train()
    batch = distilled_batch(target)
    feats = OnlineFeatures(target, obj.feature_spec())(batch)
    d = obj.drafter
    with torch.no_grad():  # the real per-dimension scale of these features
        d.feature_scale.copy_(d.raw_target_features(feats).flatten(0, 1).std(0))
    opt = torch.optim.AdamW([p for p in obj.parameters() if p.requires_grad], lr=3e-3)
    history = []
    for _ in range(60):
        out = obj.training_loss(batch, feats)
        opt.zero_grad()
        out.loss.backward()
        opt.step()
        history.append({k: float(v) for k, v in out.metrics.items()} | {"loss": out.loss.item()})
    first, last = history[0], history[-1]
    assert last["loss"] < first["loss"], (first, last)
    # a label outside the draft vocabulary is always a miss: the ceiling is the in-vocabulary share
    ceiling = last.get("in_vocab_step1", 1.0)
    assert first["acc_step1"] < 0.5 * ceiling and last["acc_step1"] > 0.9 * ceiling, (first, last)
    if version == 1:  # the feature regression itself converges, not only the token term
        assert last["feature_loss"] < 0.3 * first["feature_loss"], (first, last)
        obj.eval()  # validation unrolls on the drafter's own features and reports every step
        with torch.no_grad():
            ev = obj.training_loss(batch, feats)
        assert {"acc_step1", "acc_step2", "acc_step3", "ce_step3"} <= set(ev.metrics)
    else:
        assert last["acc_step3"] > first["acc_step3"] + 0.3 * last["in_vocab_step3"], (first, last)


def _train_cfg(out, **kw):
    base = dict(
        output_dir=str(out),
        batch_size=3,
        max_steps=6,
        lr=3e-3,
        warmup_ratio=0.3,
        log_every=1,
        eval_every=3,
        save_every=2,
        keep_checkpoints=2,
        max_seq_len=48,
        grad_accum=1,
        seed=3,
    )
    base.update(kw)
    return TrainConfig(**base)


class _Killed(Exception):
    pass


@pytest.mark.parametrize("version", [1, 3])
def test_resume_after_kill_equals_uninterrupted_run(tmp_path, target, version):
    rows = synthetic_rows(10, V)

    def run(out, on_step_end=None):
        obj = _objective(version, target, steps=2)
        cfg = _train_cfg(out)
        return train(
            obj,
            rows,
            rows.select(range(4)),
            cfg,
            make_accelerator(cfg),
            pad_id=2,
            feature_source=OnlineFeatures(target, obj.feature_spec()),
            on_step_end=on_step_end,
        )

    run(tmp_path / "straight")

    def kill_at_5(step):
        if step == 5:
            raise _Killed

    reset_accelerate()
    with pytest.raises(_Killed):
        run(tmp_path / "killed", kill_at_5)
    assert [p.name for p in complete_checkpoints(tmp_path / "killed" / "checkpoints")][-1] == "step-0000004"
    reset_accelerate()
    result = run(tmp_path / "killed")
    assert result.resumed_from.name == "step-0000004"
    a = load_file(tmp_path / "straight" / "model.safetensors")
    b = load_file(tmp_path / "killed" / "model.safetensors")
    assert a.keys() == b.keys() and "fc.weight" in a
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=1e-6, msg=k)
    fresh = _objective(version, target).drafter.state_dict()
    assert not torch.equal(fresh["fc.weight"], a["fc.weight"]), "nothing trained"
    assert "val/acc_step2" in result.val_metrics


def test_calibrated_init_picks_the_least_confident_scale_and_lowers_ce(target):
    obj = _objective(3, target, steps=2)
    batch = distilled_batch(target)
    feats = OnlineFeatures(target, obj.feature_spec())(batch)
    w0 = obj.drafter.norm.weight.detach().clone()
    with torch.no_grad():
        obj.drafter.norm.weight.mul_(20.0)  # an over-confident start, as the copied norm gives on SmolLM2
        before = float(obj.eval().training_loss(batch, feats).metrics["ce_step1"])
    c = obj.train().calibrate_output_scale(batch, feats)
    assert obj.training  # mode restored
    assert c < 1.0
    torch.testing.assert_close(obj.drafter.norm.weight, w0 * 20.0 * c)
    with torch.no_grad():
        after = float(obj.eval().training_loss(batch, feats).metrics["ce_step1"])
    assert after < before - 1.0
