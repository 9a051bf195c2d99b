"""Train Medusa heads: Medusa-1 on the frozen target, or Medusa-2 (`medusa.lora: true`) with LoRA adapters.

    python train/medusa.py --config configs/smollm2-135m/medusa.yaml [train.max_steps=100 ...]
    python -m headway.train.medusa --config configs/smollm2-135m/medusa.yaml      # the same, from any folder
    accelerate launch --config_file configs/accelerate/cpu.yaml --num_processes 2 \\
        train/medusa.py --config configs/smollm2-135m/medusa.yaml
    python scripts/cache_features.py --config configs/smollm2-135m/medusa.yaml     # only the offline cache
    python scripts/head_accuracy.py --checkpoint runs/smollm2-135m/medusa

Writes train.output_dir/{config.json, model.safetensors} (+ lora/ for Medusa-2), checkpoints/, metrics.jsonl,
and head_accuracy.json (the validation split scored per head: the profile trees are built from).
With `medusa.hidden_states: offline` the target's final normed states are extracted once into
medusa.feature_cache_dir (resumable; a single-process run builds it first, or
`python scripts/cache_features.py --config <recipe>` does just that) and training reads them from there:
the same batches, and no target forward after the cache. The shared steps are in train/recipe.py.
"""

from __future__ import annotations

import sys

from torch import nn

from headway.cli import run_main
from headway.config import Config
from headway.features import FeatureSpec
from headway.heads.medusa import MedusaHeads
from headway.heads.medusa_loss import Medusa2Objective, MedusaObjective, teacher_rows
from headway.target import target_fingerprint
from headway.train.loop import TrainResult
from headway.train.recipe import HeadRecipe, Run, draft_vocab, run_recipe


def build_heads(cfg: Config, target, tok, train_rows, log=print) -> MedusaHeads:
    """Fresh heads for the target; with medusa.draft_vocab_size, over the training split's most frequent answer tokens."""
    m = cfg.medusa
    return MedusaHeads.from_target(
        target,
        num_heads=m.num_heads,
        num_layers=m.num_layers,
        vocab=draft_vocab(m.draft_vocab_size, target, tok, train_rows, log),
        target_name=cfg.target.name,
        fc_bias=m.fc_bias,
        fingerprint=target_fingerprint(target, tok, cfg.target.name),
    )


class Medusa(HeadRecipe):
    section = "medusa"
    example = "configs/smollm2-135m/medusa.yaml"

    def check(self, cfg: Config) -> str | None:
        m = cfg.medusa
        if m.lora and m.hidden_states == "offline":
            return "Medusa-2 (medusa.lora: true) trains the target: it needs medusa.hidden_states: online"
        if m.lora and m.soft_label_weight > 0:
            return "medusa.soft_label_weight is a Medusa-1 option (Medusa-2 distils the target through its KL)"
        return None

    def find_unused_parameters(self, cfg: Config) -> bool:
        return cfg.medusa.lora

    def feature_spec(self, cfg: Config, target: nn.Module) -> FeatureSpec:
        return FeatureSpec(final_normed=True)  # what MedusaObjective reads

    def build_objective(self, run: Run) -> nn.Module:
        m, target = run.cfg.medusa, run.target
        heads = build_heads(run.cfg, target, run.tok, run.ds["train"], log=run.accelerator.print)
        if not m.lora:
            return MedusaObjective(heads, m.loss_decay, teacher_rows(heads, target), m.soft_label_weight)
        from peft import LoraConfig, get_peft_model

        lora = LoraConfig(
            r=m.lora_r, lora_alpha=m.lora_alpha, lora_dropout=m.lora_dropout, target_modules=list(m.lora_target_modules)
        )
        # Medusa-2 runs the target inside its objective, with gradients: it asks the loop for no features.
        return Medusa2Objective(
            get_peft_model(target, lora), heads, m.loss_decay, m.medusa2_lambda, m.heads_only_steps, m.lora_lr_ratio
        )

    def summary(self, cfg: Config, result: TrainResult) -> str:
        return f"Medusa heads saved to {result.output_dir} after {result.step} steps"


def main(argv: list[str] | None = None) -> int:
    return run_recipe(Medusa(), argv, __doc__)


if __name__ == "__main__":
    sys.exit(run_main(main))
