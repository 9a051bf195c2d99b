"""Medusa training objectives: Medusa-1 (frozen target) and Medusa-2 (LoRA on the target + KL to itself).

    objective = MedusaObjective(heads, loss_decay=0.8)                 # features: FeatureSpec(final_normed=True)
    objective = Medusa2Objective(peft_target, heads, loss_decay=0.8, lam=0.2, heads_only_steps=200, lora_lr_ratio=0.25)

Head k (k = 1..K) reads the target's final normed hidden state at position t and predicts y[t+k+1].
It is trained at t only when tokens t+1 .. t+k+1 are all target-generated (loss_mask 1): at inference t is
the last accepted token and everything after it is generated, so a label that sits in a user turn (or
past the answer's <|im_end|>) would teach the head something decoding never asks for.
Loss: sum_k decay^k * CE_k, each CE averaged over its head's positions; a label outside the draft
vocabulary is left out of the loss but counts as a miss in the accuracy metrics.

With `soft_label_weight` s > 0 (and `teacher_rows`, the target's lm_head rows of the draft vocabulary),
CE_k = (1-s) * CE(label) + s * CE(p_target(. | position t+k) over the draft vocabulary, head k): the
target's whole distribution over token t+k+1, read off the same final normed states the heads train on
(the teacher signal of Hydra++; greedy data makes the label its argmax). No extra target forward.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from headway.features import FeatureSpec, TargetFeatures
from headway.heads.base import LossOutput, next_token_probs, shift_left
from headway.heads.medusa import MedusaHeads
from headway.heads.soft_ce import projected_soft_ce


def medusa_head_targets(
    input_ids: torch.Tensor, loss_mask: torch.Tensor, num_heads: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """For each head k = 1..K: (valid [B, T] bool, labels [B, T] target ids = input_ids[:, t+k+1])."""
    m = loss_mask.bool()
    run = shift_left(m, 1, False)  # run[t]: tokens t+1 .. t+k+1 all generated
    out = []
    for k in range(1, num_heads + 1):
        run = run & shift_left(m, k + 1, False)
        out.append((run, shift_left(input_ids, k + 1, 0)))
    return out


def medusa_loss(
    heads: MedusaHeads,
    hidden: torch.Tensor,
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    decay: float,
    topk: tuple[int, ...] = (1, 5),
    teacher_rows: torch.Tensor | None = None,
    soft_label_weight: float = 0.0,
) -> LossOutput:
    """Sum over heads of decay^k * CE, computed only at each head's valid positions (cheap: no [B, T, V'] tensor)."""
    if hidden.shape[:2] != input_ids.shape:
        raise ValueError(f"hidden states {tuple(hidden.shape)} do not match input_ids {tuple(input_ids.shape)}")
    if soft_label_weight > 0 and teacher_rows is None:
        raise ValueError("soft_label_weight > 0 needs teacher_rows (the target's lm_head rows of the draft vocabulary)")
    if not torch.is_autocast_enabled(hidden.device.type):  # under autocast the matmuls cast it themselves
        hidden = hidden.to(heads.lm_heads[0].weight.dtype)
    total = hidden.new_zeros((), dtype=torch.float32)
    metrics: dict[str, torch.Tensor] = {}
    if soft_label_weight > 0:  # one matmul for every head: the target's distribution at each position
        teacher, teacher_row = next_token_probs(
            hidden, loss_mask.bool(), lambda x: F.linear(x, teacher_rows.to(x.dtype))
        )
    for k0, (valid, labels) in enumerate(medusa_head_targets(input_ids, loss_mask, heads.config.num_heads)):
        k = k0 + 1
        h = hidden[valid]  # [N, h]
        target_ids = labels[valid]
        draft_ids = heads.to_draft_ids(target_ids)
        in_vocab = draft_ids >= 0
        if soft_label_weight > 0 and torch.is_grad_enabled():
            # Training: the gradient over the [N, V'] logits is formed in the forward pass (heads/soft_ce.py),
            # so neither the logits nor their fp32 log-softmax stay for backward. Validation keeps top-5 below.
            rows = torch.where(in_vocab, shift_left(teacher_row, k, -1)[valid], -1)
            ce_sum, pred = projected_soft_ce(
                heads.blocks[k0](h), heads.lm_heads[k0].weight, teacher, rows, draft_ids, 1 - soft_label_weight
            )
            ce = ce_sum / in_vocab.sum().clamp(min=1)
            total = total + (decay**k) * ce
            metrics[f"head{k}/loss"] = ce.detach()
            metrics[f"head{k}/top1"] = (pred == draft_ids).sum().float() / max(1, h.shape[0])
            metrics[f"head{k}/positions"] = torch.tensor(float(h.shape[0]))
            metrics[f"head{k}/ce_positions"] = in_vocab.sum().float()  # what head{k}/loss is a mean over
            continue
        logits = heads.head_logits(k0, h).float()  # [N, V']
        if not bool(in_vocab.any()):  # keep every weight in the graph (DDP expects gradients for all of them)
            ce = logits.sum() * 0.0
        elif soft_label_weight > 0:  # one log-softmax serves the label and the target's distribution
            logq = logits[in_vocab].log_softmax(-1)
            p = teacher[shift_left(teacher_row, k, -1)[valid][in_vocab]]  # position t+k: over token t+k+1
            ce = -soft_label_weight * (p * logq).sum(-1).mean()
            if soft_label_weight < 1:
                ce = ce - (1 - soft_label_weight) * logq.gather(1, draft_ids[in_vocab][:, None]).mean()
        else:  # ignore_index, not a boolean gather: no [N, V'] copy and scatter
            ce = F.cross_entropy(logits, torch.where(in_vocab, draft_ids, -100), ignore_index=-100)
        total = total + (decay**k) * ce
        metrics[f"head{k}/loss"] = ce.detach()
        n = max(1, h.shape[0])
        with torch.no_grad():
            ranked = logits.topk(min(max(topk), logits.shape[-1]), dim=-1).indices if h.shape[0] else None
            for j in topk:
                hit = (ranked[:, :j] == draft_ids[:, None]).any(-1).sum() if ranked is not None else 0
                metrics[f"head{k}/top{j}"] = torch.as_tensor(hit, dtype=torch.float32) / n
        metrics[f"head{k}/positions"] = torch.tensor(float(h.shape[0]))
        metrics[f"head{k}/ce_positions"] = in_vocab.sum().float()
    return LossOutput(loss=total, metrics=metrics)


def teacher_rows(heads: MedusaHeads, target: nn.Module) -> torch.Tensor:
    """The target's lm_head rows of the heads' draft vocabulary: where soft labels come from."""
    w = target.get_output_embeddings().weight.detach()
    return w if heads.token_map is None else w[heads.token_map.to(w.device)]


class MedusaObjective(nn.Module):
    """Medusa-1: the heads alone on the frozen target's final normed hidden states.

    `teacher_rows` (the target's lm_head rows of the heads' draft vocabulary, frozen, not saved) enables
    soft labels: `soft_label_weight` of each head's CE is against the target's own distribution."""

    def __init__(
        self,
        heads: MedusaHeads,
        loss_decay: float = 0.8,
        teacher_rows: torch.Tensor | None = None,
        soft_label_weight: float = 0.0,
    ) -> None:
        super().__init__()
        if not 0.0 <= soft_label_weight <= 1.0:
            raise ValueError(f"soft_label_weight must be in [0, 1], got {soft_label_weight}")
        if teacher_rows is not None and teacher_rows.shape != heads.lm_heads[0].weight.shape:
            raise ValueError(
                f"teacher_rows of shape {tuple(teacher_rows.shape)}, the heads' lm_head is {tuple(heads.lm_heads[0].weight.shape)}"
            )
        self.heads = heads
        self.loss_decay = loss_decay
        self.soft_label_weight = soft_label_weight
        keep = teacher_rows is not None and soft_label_weight > 0  # hard labels only: hold no copy
        self.register_buffer("teacher_rows", teacher_rows.detach().clone() if keep else None, persistent=False)

    def feature_spec(self) -> FeatureSpec:
        return FeatureSpec(final_normed=True)

    def training_loss(self, batch: dict[str, torch.Tensor], feats: TargetFeatures) -> LossOutput:
        if feats.final_normed is None:
            raise ValueError("Medusa heads need the target's final normed hidden state (features.final_normed)")
        return medusa_loss(
            self.heads,
            feats.final_normed,
            batch["input_ids"],
            batch["loss_mask"],
            self.loss_decay,
            teacher_rows=self.teacher_rows,
            soft_label_weight=self.soft_label_weight,
        )

    def save_pretrained(self, folder) -> None:
        self.heads.save_pretrained(folder)


class Medusa2Objective(nn.Module):
    """Medusa-2: LoRA adapters on the target and the heads, trained jointly.

    loss = KL(target with adapters off || target with adapters) on the positions that predict a generated
    token, + lam * Medusa loss (whose gradient also reaches the adapters). Stage 1 (the first
    `heads_only_steps` optimizer steps) trains the heads alone: the target runs without gradients and the
    adapters' lr stays 0; they then warm up at lr * lora_lr_ratio (heads 1/ratio times faster).
    """

    find_unused_parameters = True  # in stage 1 the adapters get no gradient

    def __init__(
        self,
        target: nn.Module,  # a peft model with LoRA adapters
        heads: MedusaHeads,
        loss_decay: float = 0.8,
        lam: float = 0.2,
        heads_only_steps: int = 0,
        lora_lr_ratio: float = 0.25,
    ) -> None:
        super().__init__()
        if not hasattr(target, "disable_adapter"):
            raise TypeError("Medusa-2 needs a peft model (get_peft_model(target, LoraConfig(...)))")
        self.target = target
        self.heads = heads
        self.loss_decay = loss_decay
        self.lam = lam
        self.heads_only_steps = heads_only_steps
        self.lora_lr_ratio = lora_lr_ratio
        self.step = 0

    def feature_spec(self) -> FeatureSpec:
        return FeatureSpec()  # runs the target itself: the loop supplies no features

    def set_step(self, step: int) -> None:
        self.step = step

    @property
    def adapters_training(self) -> bool:
        return self.step >= self.heads_only_steps

    def param_groups(self, lr: float) -> list[dict]:
        lora = [p for n, p in self.target.named_parameters() if p.requires_grad]
        if not lora:
            raise ValueError("the peft target has no trainable adapter weights")
        return [
            {"params": list(self.heads.parameters()), "lr": lr},
            {"params": lora, "lr": lr * self.lora_lr_ratio, "start_step": self.heads_only_steps},
        ]

    def _final_hidden(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.target.get_decoder()(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False
        ).last_hidden_state

    def training_loss(self, batch: dict[str, torch.Tensor], feats: TargetFeatures) -> LossOutput:
        train_adapters = self.adapters_training and torch.is_grad_enabled()
        with torch.set_grad_enabled(train_adapters):
            hidden = self._final_hidden(batch)
        heads_out = medusa_loss(self.heads, hidden, batch["input_ids"], batch["loss_mask"], self.loss_decay)
        metrics = dict(heads_out.metrics)
        loss = self.lam * heads_out.loss
        # The target's own positions: logits at t predict t+1; keep those whose next token is generated.
        predicts_generated = shift_left(batch["loss_mask"].bool(), 1, False)
        if self.adapters_training:
            lm_head = self.target.get_output_embeddings()
            with torch.no_grad(), self.target.disable_adapter():
                teacher = lm_head(self._final_hidden(batch)[predicts_generated]).float().log_softmax(-1)
            student = lm_head(hidden[predicts_generated]).float().log_softmax(-1)
            if student.shape[0] > 0:
                kl = F.kl_div(student, teacher, log_target=True, reduction="batchmean")
            else:
                kl = student.sum() * 0.0
            loss = loss + kl
            metrics["target/kl"] = kl.detach()
        else:
            metrics["target/kl"] = torch.zeros((), device=hidden.device)
        metrics["target/positions"] = predicts_generated.sum().float()  # what target/kl is a mean over
        metrics["heads/loss"] = heads_out.loss.detach()
        return LossOutput(loss=loss, metrics=metrics)

    def save_pretrained(self, folder) -> None:
        """The heads as usual, the adapter beside them in `lora/` (PeftModel.from_pretrained(target, folder/'lora'))."""
        from pathlib import Path

        self.heads.save_pretrained(folder)
        self.target.save_pretrained(str(Path(folder) / "lora"))


@torch.no_grad()
def topk_hits(heads: MedusaHeads, hidden: torch.Tensor, input_ids: torch.Tensor, loss_mask: torch.Tensor, topk: int = 10):
    """Per head: (hits [topk] where hits[j] counts labels ranked within the top j+1, number of positions)."""
    hidden = hidden.to(heads.lm_heads[0].weight.dtype)
    out = []
    for k0, (valid, labels) in enumerate(medusa_head_targets(input_ids, loss_mask, heads.config.num_heads)):
        draft_ids = heads.to_draft_ids(labels[valid])
        logits = heads.head_logits(k0, hidden[valid])
        ranked = logits.topk(min(topk, logits.shape[-1]), dim=-1).indices
        first_hit = (ranked == draft_ids[:, None]).float()
        hits = first_hit.cumsum(-1).sum(0)  # OOV labels (-1) never match: a miss at every rank
        if hits.numel() < topk:
            hits = torch.cat([hits, hits[-1:].expand(topk - hits.numel())])
        out.append((hits.cpu(), int(valid.sum())))
    return out
