"""The training-objective interface every head type implements; the loop never asks which head it holds.

A head states what it needs from the target (`FeatureSpec`, headway/features.py); the loop gets exactly
that, from an online forward of the frozen target or from an offline feature cache, as `TargetFeatures`;
the head turns a batch plus those features into a loss and per-position metrics.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import torch

if TYPE_CHECKING:  # annotations only: FeatureSpec and TargetFeatures are imported from headway.features
    from headway.features import FeatureSpec, TargetFeatures


CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"


def checkpoint_files(folder: str | Path, what: str) -> tuple[Path, Path]:
    """A head folder's config.json and model.safetensors, both present (else the missing one is named)."""
    folder = Path(folder)
    cfg_path, w_path = folder / CONFIG_FILE, folder / WEIGHTS_FILE
    for p in (cfg_path, w_path):
        if not p.is_file():
            raise FileNotFoundError(f"{what} folder {folder} lacks {p.name}")
    return cfg_path, w_path


@dataclass
class LossOutput:
    loss: torch.Tensor  # scalar, what the optimizer minimises
    metrics: dict[str, torch.Tensor] = field(default_factory=dict)  # scalars for logging (detached)


def count_key(metric: str) -> str | None:
    """The metric holding the count that `metric` is a batch's mean over, by the objectives' names:
    Medusa's `head{k}/top1` over `head{k}/positions` and its `head{k}/loss` over `head{k}/ce_positions`
    (those whose label is in the draft vocabulary), Medusa-2's `target/kl` over `target/positions`, EAGLE's
    `acc_step{i}` and `in_vocab_step{i}` over `pairs_step{i}`, its `ce_step{i}` over `ce_pairs_step{i}` and
    EAGLE-1's `feature_loss` over `pairs_step1`. The training loop weights each batch's mean by it
    (train/metric_means.py), so a short batch counts for its positions, not as much as a full one."""
    head, sep, name = metric.partition("/")
    if sep and (head == "target" or (head.startswith("head") and head[4:].isdigit())):
        if name.endswith("positions"):
            return None  # a count
        return f"{head}/ce_positions" if name == "loss" and head != "target" else f"{head}/positions"
    if metric == "feature_loss":
        return "pairs_step1"
    kind, sep, step = metric.rpartition("_step")
    if sep and step.isdigit() and kind in ("acc", "in_vocab"):
        return f"pairs_step{step}"
    if sep and step.isdigit() and kind == "ce":
        return f"ce_pairs_step{step}"
    return None


def shift_left(x: torch.Tensor, n: int, fill=0) -> torch.Tensor:
    """x[:, t + n] at t (dim 1), `fill` past the end: aligns position t with what it predicts."""
    if n == 0:
        return x
    pad_shape = (x.shape[0], min(n, x.shape[1]), *x.shape[2:])
    pad = torch.full(pad_shape, fill, dtype=x.dtype, device=x.device)
    return torch.cat([x[:, n:], pad], dim=1)


@torch.no_grad()
def next_token_probs(
    source: torch.Tensor, generated: torch.Tensor, to_logits
) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's distribution over the next token at every position whose next token is target-generated
    (bool `generated` [B, T]), computed once for all the heads or unrolled steps that learn from it:
    (probs [N, V] fp32, row [B, T] -> its row in probs, -1 elsewhere). `to_logits` maps source rows to logits."""
    need = shift_left(generated, 1, fill=False)
    probs = torch.softmax(to_logits(source[need]).float(), dim=-1)
    row = torch.full(need.shape, -1, dtype=torch.long, device=need.device)
    row[need] = torch.arange(probs.shape[0], device=need.device)
    return probs, row


class HeadObjective(Protocol):
    def feature_spec(self) -> FeatureSpec: ...

    def training_loss(self, batch: dict[str, torch.Tensor], feats: TargetFeatures) -> LossOutput:
        """batch: input_ids [B, T], attention_mask [B, T], loss_mask [B, T] (1 on target-generated tokens)."""
        ...
