"""EAGLE training objectives (the `HeadObjective` interface of heads/base.py).

    objective = Eagle3Objective(drafter, EagleLossConfig.from_config(cfg.eagle), pad_id=tok.pad_token_id)
    out = objective.training_loss(batch, feats)    # LossOutput: loss, metrics ce_step{i}, acc_step{i}, ...

Alignment (step i = 0, 1, ...; reported 1-based as step{i+1}): at anchor t the drafter reads token t+1+i
and, at step 0, the target feature f_t; its output predicts token t+2+i, whose target distribution is the
target's at position t+1+i. A pair counts where tokens t+1 .. t+2+i are all target-generated (loss_mask).

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

from headway.features import FeatureSpec, TargetFeatures, eagle_feature_spec
from headway.heads.base import LossOutput, next_token_probs, shift_left
from headway.heads.eagle import Eagle1Drafter, Eagle3Drafter, EagleDrafter
from headway.heads.soft_ce import projected_soft_ce


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

    mask: torch.Tensor  # bool [B, T]: pair counted (tokens t+1 .. t+2+i real and target-generated)
    input_ids: torch.Tensor  # [B, T]: token t+1+i, the step's input token
    labels: torch.Tensor  # [B, T]: token t+2+i, the step's prediction target
    target_position: torch.Tensor  # [B, T]: t+1+i, where the target's distribution over token t+2+i sits


def align_step(batch: dict[str, torch.Tensor], step: int, pad_id: int = 0) -> AlignedStep:
    """Step `step` at anchor t counts when tokens t+1 .. t+2+step are all real and target-generated.

    At inference token t+1 is the target's own last token and the chain t+2 .. t+2+step is drafted inside
    one answer; a pair reaching into a prompt (or across a user turn) is one decoding never asks for.
    """
    ids = batch["input_ids"]
    generated = batch["loss_mask"].bool() & batch["attention_mask"].bool()
    run = shift_left(generated, 1, fill=False)
    for k in range(2, 3 + step):
        run = run & shift_left(generated, k, fill=False)
    T = ids.shape[1]
    positions = torch.arange(T, device=ids.device)[None].expand_as(ids)
    return AlignedStep(
        mask=run,
        input_ids=shift_left(ids, 1 + step, fill=pad_id),
        labels=shift_left(ids, 2 + step, fill=pad_id),
        target_position=positions + 1 + step,
    )


class EagleObjective(nn.Module):
    """Holds the drafter (the trainable module); `training_loss` is the loop's only entry."""

    def __init__(self, drafter: EagleDrafter, loss: EagleLossConfig, pad_id: int = 0) -> None:
        super().__init__()
        if loss.unroll_steps < 1:
            raise ValueError(f"unroll_steps must be >= 1, got {loss.unroll_steps}")
        self.drafter = drafter
        self.loss_cfg = loss
        self.pad_id = pad_id

    def feature_spec(self) -> FeatureSpec:
        """What training reads from the target: what drafting reads, plus what the loss needs."""
        c = self.drafter.config
        return eagle_feature_spec(
            c.version, c.num_target_layers, c.feature_layers, c.feature_source, training=True
        )

    def save_pretrained(self, folder) -> None:
        """The loop's final export: the drafter folder (config.json + model.safetensors)."""
        self.drafter.save_pretrained(folder)

    @staticmethod
    def _target_probs(batch, source: torch.Tensor, to_logits) -> tuple[torch.Tensor, torch.Tensor]:
        """The target's distribution at every position whose next token is generated (every step reuses it)."""
        generated = batch["loss_mask"].bool() & batch["attention_mask"].bool()
        return next_token_probs(source, generated, lambda x: to_logits(x.float()))

    @staticmethod
    def _rows_for_step(u, row: torch.Tensor, step: int, m: torch.Tensor) -> torch.Tensor:
        """Rows of the target distribution (position anchor+1+step) for the counted pairs `m` of a step."""
        T = row.shape[1]
        return row.gather(1, (u.index + 1 + step).clamp(max=T - 1))[m]

    def _step_metrics(self, metrics, i, draft_pred, labels, ce, ce_pairs: torch.Tensor) -> None:
        """acc over all counted pairs of step i, ce over `ce_pairs` of them (same keys for every batch)."""
        n = torch.tensor(float(labels.numel()), device=labels.device)
        pred = self.drafter.to_target_ids(draft_pred)
        metrics[f"pairs_step{i + 1}"] = n
        metrics[f"acc_step{i + 1}"] = (pred == labels).float().sum().detach() / n.clamp_min(1)
        metrics[f"ce_step{i + 1}"] = ce.detach().float()
        metrics[f"ce_pairs_step{i + 1}"] = ce_pairs.detach().float()


class Eagle1Objective(EagleObjective):
    drafter: Eagle1Drafter

    def training_loss(self, batch: dict[str, torch.Tensor], feats: TargetFeatures) -> LossOutput:
        d, cfg = self.drafter, self.loss_cfg
        raw = d.raw_target_features(feats)
        z = d.scale_features(raw)
        z_in = z
        if self.training and cfg.noise > 0:
            z_in = z + (torch.rand_like(z) - 0.5) * cfg.noise
        steps = 1 if self.training else cfg.unroll_steps
        ids, attn = batch["input_ids"], batch["attention_mask"]
        anchors = align_step(batch, 1, self.pad_id).mask if steps > 1 else None
        metrics: dict[str, torch.Tensor] = {}
        loss = None
        probs, row = self._target_probs(batch, raw, d.target_logits)
        for i, u in enumerate(d.unroll(ids, z_in, attn, steps, self.pad_id, anchors=anchors)):
            al = align_step(batch, i, self.pad_id)
            m = u.take(al.mask) & u.valid
            n = m.sum().clamp_min(1)
            pred = u.hidden[m]
            logits = d.logits(pred)
            target = probs[self._rows_for_step(u, row, i, m)]
            ce = F.cross_entropy(logits.float(), target, reduction="sum") / n
            self._step_metrics(metrics, i, logits.argmax(-1), u.take(al.labels)[m], ce, m.sum())
            if i == 0:
                target_z = u.take(shift_left(z, 1))[m]
                feat = F.smooth_l1_loss(pred.float(), target_z.float(), reduction="sum") / (
                    n * pred.shape[-1]
                )
                metrics["feature_loss"] = feat.detach()
                loss = cfg.feature_loss_weight * feat + cfg.token_loss_weight * ce
        return LossOutput(loss=loss, metrics=metrics)


class Eagle3Objective(EagleObjective):
    drafter: Eagle3Drafter

    def draft_vocab_target_logits(self, final_normed: torch.Tensor) -> torch.Tensor:
        """The target's logits restricted to the draft vocabulary, from its final normed hidden state."""
        d = self.drafter
        w = d.target_parts.lm_head.weight
        rows = w[d.token_map.to(w.device)].float()
        return F.linear(final_normed.float(), rows)

    @torch.no_grad()
    def calibrate_output_scale(
        self, batch, feats: TargetFeatures, grid: tuple[float, ...] = (1.0, 0.7, 0.5, 0.35, 0.25, 0.2)
    ) -> float:
        """Scale the fresh drafter's final norm weight (a copy of the target's) to the grid value with the
        lowest step-1 CE on `batch`. The target's norm expects a hidden state whose energy sits in a few
        outlier dimensions; a random drafter's is spread evenly, so the copied norm gives over-confident
        logits (SmolLM2: CE ~19 nats against ~9 for uniform), which Adam takes many steps to undo. The
        grid stops at 0.2: smaller scales only look better by being closer to uniform, and a norm weight
        far below its trained size is as slow to grow back (smoke test on SmolLM2, 48 steps: step-3
        accuracy 0.31 from 0.2x against 0.13 from 1x)."""
        d = self.drafter
        w0 = d.norm.weight.detach().clone()
        was_training = self.training
        self.eval()
        ce = {}
        for c in grid:
            d.norm.weight.copy_(w0 * c)
            ce[c] = float(self.training_loss(batch, feats, steps=1).metrics["ce_step1"])
        best = min(ce, key=ce.get)
        d.norm.weight.copy_(w0 * best)
        self.train(was_training)
        return best

    def training_loss(
        self, batch: dict[str, torch.Tensor], feats: TargetFeatures, steps: int | None = None
    ) -> LossOutput:
        d, cfg = self.drafter, self.loss_cfg
        if feats.final_normed is None:
            raise ValueError(
                "EAGLE-3 training needs the target's final normed hidden state (features.final_normed)"
            )
        fused = d.features_from_target(feats)
        ids, attn, steps = batch["input_ids"], batch["attention_mask"], steps or cfg.unroll_steps
        anchors = align_step(batch, 1, self.pad_id).mask if steps > 1 else None
        metrics: dict[str, torch.Tensor] = {}
        loss = fused.new_zeros((), dtype=torch.float32)
        probs, row = self._target_probs(batch, feats.final_normed, self.draft_vocab_target_logits)
        for i, u in enumerate(d.unroll(ids, fused, attn, steps, self.pad_id, anchors=anchors)):
            al = align_step(batch, i, self.pad_id)
            m = u.take(al.mask) & u.valid
            labels = u.take(al.labels)[m]
            in_vocab = d.t2d[labels]
            rows = self._rows_for_step(u, row, i, m).masked_fill(~in_vocab, -1)  # out of vocabulary: no loss
            # d.logits(h) = lm_head(norm(h)); the projection and its CE never keep [pairs, vocab] for backward
            ce_sum, pred = projected_soft_ce(d.norm(u.hidden[m]), d.lm_head.weight, probs, rows)
            ce = ce_sum / in_vocab.sum().clamp_min(1)
            loss = loss + cfg.step_decay**i * ce
            self._step_metrics(metrics, i, pred, labels, ce, in_vocab.sum())  # out-of-vocabulary pairs: no loss
            metrics[f"in_vocab_step{i + 1}"] = in_vocab.float().sum().detach() / max(1, in_vocab.numel())
        return LossOutput(loss=loss, metrics=metrics)


def build_objective(drafter: EagleDrafter, loss: EagleLossConfig, pad_id: int = 0) -> EagleObjective:
    cls = Eagle3Objective if isinstance(drafter, Eagle3Drafter) else Eagle1Objective
    return cls(drafter, loss, pad_id)
