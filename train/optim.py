"""AdamW over the trainable weights and a cosine schedule with linear warm-up, per parameter group.

An objective may split its weights into groups (`param_groups(lr)`: dicts with `params`, `lr`, and an
optional `start_step`): a group with `start_step` s stays at lr 0 until step s, then warms up and decays
over the steps left (Medusa-2: adapters join after the heads-only stage, at their own lr).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from headway.config import TrainConfig


def default_param_groups(model: nn.Module, lr: float) -> list[dict]:
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("the objective has no trainable weights")
    return [{"params": params, "lr": lr}]


def build_optimizer(groups: list[dict], cfg: TrainConfig) -> torch.optim.AdamW:
    if len(cfg.adam_betas) != 2:
        raise ValueError(f"train.adam_betas needs two values, got {cfg.adam_betas}")
    clean = [{k: v for k, v in g.items() if k != "start_step"} for g in groups]
    return torch.optim.AdamW(clean, lr=cfg.lr, betas=tuple(cfg.adam_betas), weight_decay=cfg.weight_decay)


def cosine_with_warmup(step: int, total: int, warmup: int, start: int = 0) -> float:
    """lr multiplier at optimizer step `step`: 0 before `start`, linear warm-up, cosine to 0 at `total`."""
    if step < start:
        return 0.0
    step, total = step - start, max(1, total - start)
    warmup = min(warmup, total)
    if step < warmup:
        return (step + 1) / (warmup + 1)
    progress = (step - warmup) / max(1, total - warmup)
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def build_scheduler(optimizer, groups: list[dict], total_steps: int, warmup_ratio: float):
    lambdas = []
    for g in groups:
        start = int(g.get("start_step", 0))
        warmup = math.ceil(warmup_ratio * max(1, total_steps - start))
        lambdas.append(lambda s, start=start, warmup=warmup: cosine_with_warmup(s, total_steps, warmup, start))
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambdas)
