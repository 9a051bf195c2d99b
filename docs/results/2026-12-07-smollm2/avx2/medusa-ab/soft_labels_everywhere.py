"""A/B: Medusa-1 trained on the target's distribution at every position, prompt tokens included
(soft_label_weight 1 needs no label, only the target's own next-token distribution); validation unchanged.

    python docs/results/2026-12-07-smollm2/avx2/medusa-ab/soft_labels_everywhere.py \\
        --config configs/smollm2-135m/medusa.yaml data.output_dir=runs/ab/data \\
        train.output_dir=runs/ab/medusa-allpos6 train.epochs=6 train.eval_every=100 train.save_every=1000
"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[5]))
import headway.train.medusa as recipe  # noqa: E402
from headway.cli import run_main  # noqa: E402
from headway.heads.medusa_loss import MedusaObjective  # noqa: E402

generated_only = MedusaObjective.training_loss


def every_position(self, batch, feats):
    if torch.is_grad_enabled():  # training steps only: validation keeps the generated-token mask
        batch = {**batch, "loss_mask": batch["attention_mask"]}
    return generated_only(self, batch, feats)


MedusaObjective.training_loss = every_position
sys.exit(run_main(recipe.main))
