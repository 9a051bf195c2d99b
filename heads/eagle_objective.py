"""EAGLE training objectives (the `HeadObjective` interface of heads/base.py).

    objective = Eagle3Objective(drafter, EagleLossConfig.from_config(cfg.eagle), pad_id=tok.pad_token_id)
    out = objective.training_loss(batch, feats)    # LossOutput: loss, metrics ce_step{i}, acc_step{i}, ...

Alignment (step i = 0, 1, ...; reported 1-based as step{i+1}): at anchor t the drafter reads token t+1+i
and, at step 0, the target feature f_t; its output predicts token t+2+i, whose target distribution is the
target's at position t+1+i. A pair counts where token t+2+i is target-generated (loss_mask) and real.

- EAGLE-1: loss = w_f * SmoothL1(predicted feature, f_{t+1}) + w_t * CE(target distribution, draft),
  both at step 0, on (scaled) features; uniform noise U(-a/2, a/2) on the input features while training
  (a = `noise`, in model space, i.e. in units of each dimension's std with feature_norm per_dim).
  Validation (module in eval mode) also unrolls `unroll_steps` steps on the drafter's own features.
- EAGLE-3: loss = sum_i decay^i * CE(target distribution restricted to the draft vocabulary, draft
  logits at step i) over `unroll_steps` steps; pairs whose token t+2+i is outside the draft vocabulary
  are masked out of the loss (they still count as misses in acc_step{i}).

acc_step{i}: the drafter's top-1 (as a target id) equals token t+2+i, over all counted pairs: with greedy
self-distilled data that is the token greedy verification accepts.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from heads.base import FeatureSpec, LossOutput, TargetFeatures
from heads.eagle import Eagle1Drafter, Eagle3Drafter, EagleDrafter, shift_left


@dataclass
class EagleLossConfig:
    feature_loss_weight: float = 1.0
    token_loss_weight: float = 0.1
    noise: float = 0.2
    unroll_steps: int = 7
    step_decay: float = 0.8

    @classmethod
    def from_config(cls, eagle_cfg) -> EagleLossConfig:
        return cls(
            feature_loss_weight=eagle_cfg.feature_loss_weight,
            token_loss_weight=eagle_cfg.token_loss_weight,
            noise=eagle_cfg.noise,
            unroll_steps=eagle_cfg.unroll_steps,
            step_decay=eagle_cfg.step_decay,
        )


@dataclass
class AlignedStep:
    """Which (row, anchor) pairs step i trains on, and what they read and predict."""

    mask: torch.Tensor  # bool [B, T]: pair counted (token t+2+i real and target-generated)
    input_ids: torch.Tensor  # [B, T]: token t+1+i, the step's input token
    labels: torch.Tensor  # [B, T]: token t+2+i, the step's prediction target
    target_position: torch.Tensor  # [B, T]: t+1+i, where the target's distribution over token t+2+i sits


def align_step(batch: dict[str, torch.Tensor], step: int, pad_id: int = 0) -> AlignedStep:
    ids = batch["input_ids"]
    counted = batch["loss_mask"].bool() & batch["attention_mask"].bool()
    T = ids.shape[1]
    positions = torch.arange(T, device=ids.device)[None].expand_as(ids)
    return AlignedStep(
        mask=shift_left(counted, 2 + step, fill=False),
        input_ids=shift_left(ids, 1 + step, fill=pad_id),
        labels=shift_left(ids, 2 + step, fill=pad_id),
        target_position=positions + 1 + step,
    )


def _soft_ce(target_logits: torch.Tensor, draft_logits: torch.Tensor) -> torch.Tensor:
    """Mean over rows of -sum_v p_target(v) log q_draft(v)."""
    p = torch.softmax(target_logits.float(), dim=-1)
    return -(p * torch.log_softmax(draft_logits.float(), dim=-1)).sum(-1).mean()


class EagleObjective(nn.Module):
    """Holds the drafter (the trainable module); `training_loss` is the loop's only entry."""

    def __init__(self, drafter: EagleDrafter, loss: EagleLossConfig, pad_id: int = 0) -> None:
        super().__init__()
        if loss.unroll_steps < 1:
            raise ValueError(f"unroll_steps must be >= 1, got {loss.unroll_steps}")
        self.drafter = drafter
        self.loss_cfg = loss
        self.pad_id = pad_id

    def _step_metrics(self, metrics, i, logits, aligned_mask, labels, ce):
        """acc over all counted pairs of step i; logits are those of the counted pairs in mask order."""
        n = int(aligned_mask.sum())
        metrics[f"pairs_step{i + 1}"] = torch.tensor(float(n))
        if n:
            pred = self.drafter.to_target_ids(logits.argmax(-1))
            metrics[f"acc_step{i + 1}"] = (pred == labels[aligned_mask]).float().mean().detach()
        if ce is not None:
            metrics[f"ce_step{i + 1}"] = ce.detach()


class Eagle1Objective(EagleObjective):
    drafter: Eagle1Drafter

    def feature_spec(self) -> FeatureSpec:
        return self.drafter.feature_spec()  # the targets come from the same feature

    def training_loss(self, batch: dict[str, torch.Tensor], feats: TargetFeatures) -> LossOutput:
        d, cfg = self.drafter, self.loss_cfg
        raw = d.raw_target_features(feats)
        z = d.scale_features(raw)
        z_in = z
        if self.training and cfg.noise > 0:
            z_in = z + (torch.rand_like(z) - 0.5) * cfg.noise
        steps = 1 if self.training else cfg.unroll_steps
        hidden = d.unroll(batch["input_ids"], z_in, batch["attention_mask"], steps, self.pad_id)
        metrics: dict[str, torch.Tensor] = {}
        loss = hidden[0].sum() * 0.0  # keeps the graph when a batch has no counted pair
        for i, h in enumerate(hidden):
            al = align_step(batch, i, self.pad_id)
            m = al.mask
            if not m.any():
                self._step_metrics(metrics, i, None, m, al.labels, None)
                continue
            pred = h[m]
            logits = d.logits(pred)
            with torch.no_grad():
                target_logits = d.target_logits(shift_left(raw, 1 + i)[m].float())
            ce = _soft_ce(target_logits, logits)
            self._step_metrics(metrics, i, logits, m, al.labels, ce)
            if i == 0:
                feat = F.smooth_l1_loss(pred.float(), shift_left(z, 1)[m].float())
                metrics["feature_loss"] = feat.detach()
                loss = cfg.feature_loss_weight * feat + cfg.token_loss_weight * ce
        metrics["loss"] = loss.detach()
        return LossOutput(loss=loss, metrics=metrics)


class Eagle3Objective(EagleObjective):
    drafter: Eagle3Drafter

    def feature_spec(self) -> FeatureSpec:
        spec = self.drafter.feature_spec()
        return FeatureSpec(layers=spec.layers, final_normed=True)  # final_normed: the target's distributions

    def draft_vocab_target_logits(self, final_normed: torch.Tensor) -> torch.Tensor:
        """The target's logits restricted to the draft vocabulary, from its final normed hidden state."""
        d = self.drafter
        w = d.target_parts.lm_head.weight
        rows = w[d.token_map.to(w.device)].float()
        return F.linear(final_normed.float(), rows)

    def training_loss(self, batch: dict[str, torch.Tensor], feats: TargetFeatures) -> LossOutput:
        d, cfg = self.drafter, self.loss_cfg
        if feats.final_normed is None:
            raise ValueError("EAGLE-3 training needs the target's final normed hidden state (features.final_normed)")
        fused = d.features_from_target(feats)
        hidden = d.unroll(batch["input_ids"], fused, batch["attention_mask"], cfg.unroll_steps, self.pad_id)
        t2d = d.t2d
        metrics: dict[str, torch.Tensor] = {}
        loss = hidden[0].sum() * 0.0
        for i, h in enumerate(hidden):
            al = align_step(batch, i, self.pad_id)
            m = al.mask
            if not m.any():
                self._step_metrics(metrics, i, None, m, al.labels, None)
                continue
            logits = d.logits(h[m])
            in_vocab = t2d[al.labels[m]]
            ce = None
            if in_vocab.any():
                with torch.no_grad():
                    target = self.draft_vocab_target_logits(shift_left(feats.final_normed, 1 + i)[m][in_vocab])
                ce = _soft_ce(target, logits[in_vocab])
                loss = loss + cfg.step_decay**i * ce
            self._step_metrics(metrics, i, logits, m, al.labels, ce)
            metrics[f"in_vocab_step{i + 1}"] = in_vocab.float().mean().detach()
        metrics["loss"] = loss.detach()
        return LossOutput(loss=loss, metrics=metrics)


def build_objective(drafter: EagleDrafter, loss: EagleLossConfig, pad_id: int = 0) -> EagleObjective:
    cls = Eagle3Objective if isinstance(drafter, Eagle3Drafter) else Eagle1Objective
    return cls(drafter, loss, pad_id)
