"""Train an EAGLE drafter: EAGLE-1 (`eagle.version: 1`) or EAGLE-3 (`eagle.version: 3`) on the frozen target.

    python scripts/cache_features.py --config configs/smollm2-135m/eagle3.yaml      # offline features first
    accelerate launch --config_file configs/accelerate/cpu.yaml train/eagle.py --config configs/smollm2-135m/eagle3.yaml
    python train/eagle.py --config configs/smollm2-135m/eagle.yaml train.max_steps=100 eagle.feature_norm=none
    python -m headway.train.eagle --config configs/smollm2-135m/eagle3.yaml          # the same, from any folder

Hidden states come from the target inside the loop (`eagle.hidden_states: online`) or from the cache that
`python scripts/cache_features.py --config <recipe>` builds (`offline`: no target forward; the target's
embedding and head are still loaded, the drafter shares them; a single-process run builds or finishes a
missing cache first). With `eagle.feature_norm: per_dim` the per-dimension std of the target
features on generated tokens (offline: the whole train split, from the cache; online: the first
`eagle.norm_stats_rows` train rows, kept in train.output_dir/feature_stats.safetensors) is stored in the
drafter as `feature_scale`. The run ends by writing head_accuracy.json (the drafter unrolled over the
validation split, per depth: the profile `tree_budget: auto` reads). The shared steps are in train/recipe.py.

Writes train.output_dir/{config.json, model.safetensors}, checkpoints/, metrics.jsonl (per-step
val/acc_step{i}, val/ce_step{i}, train/tokens_per_s), train_summary.json.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from torch import nn

from headway.cli import run_main
from headway.config import Config
from headway.data.dataset import collate, select_rows
from headway.data.feature_stats import FeatureMoments, generated_mask
from headway.data.features import OnlineFeatures
from headway.features import FeatureSpec, eagle_feature_spec, feature_key
from headway.heads.eagle import Eagle1Drafter, Eagle3Drafter, EagleDrafter
from headway.heads.eagle_objective import EagleLossConfig, build_objective
from headway.target import target_fingerprint
from headway.train.loop import TrainResult
from headway.train.recipe import Batches, HeadRecipe, Run, draft_vocab, run_recipe

STATS_FILE = "feature_stats.safetensors"


def build_drafter(cfg: Config, target, tok, train_rows, log=print) -> EagleDrafter:
    """A fresh drafter for the target; EAGLE-3's draft vocabulary is rebuilt from the training split every run."""
    e = cfg.eagle
    fingerprint = target_fingerprint(target, tok, cfg.target.name)
    if e.version == 1:
        return Eagle1Drafter.from_target(
            target,
            feature_source=e.feature_source,
            feature_norm=e.feature_norm,
            target_name=cfg.target.name,
            fingerprint=fingerprint,
        )
    return Eagle3Drafter.from_target(
        target,
        feature_layers=e.feature_layers,
        vocab=draft_vocab(e.draft_vocab_size, target, tok, train_rows, log),
        feature_norm=e.feature_norm,
        target_name=cfg.target.name,
        fingerprint=fingerprint,
    )


def drafter_feature_std(drafter: EagleDrafter, moments: FeatureMoments) -> torch.Tensor:
    """The std of exactly the features the drafter reads, in its order (EAGLE-3: three layers concatenated)."""
    spec = drafter.feature_spec()
    keys = [feature_key("layer", i) for i in spec.layers] + (
        [feature_key("final_normed")] if spec.final_normed else []
    )
    return torch.cat([moments.std(k) for k in keys])


def online_moments(
    target, spec: FeatureSpec, rows, pad_id: int, max_len: int, batch_size: int
) -> FeatureMoments:
    """Feature moments on generated tokens of `rows`, from forwards of the target."""
    extract = OnlineFeatures(target, spec)
    device = next(target.parameters()).device
    moments = FeatureMoments()
    lengths = [min(len(x), max_len) for x in rows["input_ids"]]
    order = sorted(range(len(rows)), key=lambda i: -lengths[i])
    for b in range(0, len(order), batch_size):
        batch = collate([rows[i] for i in order[b : b + batch_size]], pad_id=pad_id, max_len=max_len)
        batch = {k: v.to(device) for k, v in batch.items()}
        moments.update(extract(batch), generated_mask(batch))
    return moments


def stats_for_online_run(
    cfg: Config, target, tok, train_rows, spec: FeatureSpec, accelerator
) -> FeatureMoments:
    """Computed once per output folder and kept there: a resumed run uses exactly the same scale."""
    from safetensors import safe_open

    path = Path(cfg.train.output_dir) / STATS_FILE
    n = min(len(train_rows), cfg.eagle.norm_stats_rows)
    identity = json.dumps(
        {
            "target": target_fingerprint(target, tok, cfg.target.name),
            "rows": n,
            "max_len": cfg.train.max_seq_len,
        },
        sort_keys=True,
    )
    if path.is_file():
        with safe_open(str(path), framework="pt") as f:
            if (f.metadata() or {}).get("identity") == identity:
                return FeatureMoments.from_tensors({k: f.get_tensor(k) for k in f.keys()})
    accelerator.print(f"feature statistics over the first {n} train rows")
    moments = online_moments(
        target, spec, train_rows.select(range(n)), tok.pad_token_id, cfg.train.max_seq_len, 8
    )
    if accelerator.is_main_process:
        from safetensors.torch import save_file

        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        save_file(moments.to_tensors(), str(tmp), metadata={"identity": identity})
        tmp.replace(path)
    return moments


class Eagle(HeadRecipe):
    section = "eagle"
    example = "configs/smollm2-135m/eagle3.yaml"

    def feature_spec(self, cfg: Config, target: nn.Module) -> FeatureSpec:
        e = cfg.eagle
        return eagle_feature_spec(
            e.version, target.config.num_hidden_layers, e.feature_layers, e.feature_source, training=True
        )

    def build_objective(self, run: Run) -> nn.Module:
        drafter = build_drafter(run.cfg, run.target, run.tok, run.ds["train"], log=run.accelerator.print)
        return build_objective(drafter, EagleLossConfig.from_config(run.cfg.eagle), pad_id=run.tok.pad_token_id)

    def before_training(self, run: Run, objective: nn.Module, batches: Batches) -> None:
        e, accelerator, drafter = run.cfg.eagle, run.accelerator, objective.drafter
        if e.feature_norm == "per_dim":
            if run.cache is not None:
                moments = run.cache.moments()
            else:
                moments = stats_for_online_run(
                    run.cfg, run.target, run.tok, run.ds["train"], drafter.feature_spec(), accelerator
                )
            std = drafter_feature_std(drafter, moments)
            drafter.set_feature_scale(std)
            accelerator.print(
                f"feature_norm per_dim: std median {std.median():.3g}, max {std.max():.3g} over {std.numel()} dimensions"
            )
        if e.version == 3 and e.calibrate_init:
            first = list(range(min(len(batches.train_rows), run.cfg.train.batch_size)))
            batch = batches.collate_fn(select_rows(batches.train_rows, first))
            batch = {k: v.to(accelerator.device) for k, v in batch.items()}
            c = objective.calibrate_output_scale(batch, batches.feature_source(batch))
            accelerator.print(f"drafter norm initialised at {c} x the target's (least step-1 CE on the first batch)")

    def summary(self, cfg: Config, result: TrainResult) -> str:
        steps = sorted(k for k in result.val_metrics if k.startswith("val/acc_step"))
        return f"EAGLE-{cfg.eagle.version} drafter saved to {result.output_dir} after {result.step} steps; " + " ".join(
            f"{k.removeprefix('val/')}={result.val_metrics[k]:.3f}" for k in steps
        )


def main(argv: list[str] | None = None) -> int:
    return run_recipe(Eagle(), argv, __doc__)


if __name__ == "__main__":
    sys.exit(run_main(main))
