"""Train an EAGLE drafter: EAGLE-1 (`eagle.version: 1`) or EAGLE-3 (`eagle.version: 3`) on the frozen target.

    python scripts/cache_features.py --config configs/smollm2-135m/eagle3.yaml      # offline features first
    accelerate launch --config_file configs/accelerate/cpu.yaml train/eagle.py --config configs/smollm2-135m/eagle3.yaml
    python train/eagle.py --config configs/smollm2-135m/eagle.yaml train.max_steps=100 eagle.feature_norm=none
    python train/eagle.py --config configs/smollm2-135m/eagle3.yaml --cache-only      # = scripts/cache_features.py

Hidden states come from the target inside the loop (`eagle.hidden_states: online`) or from the cache of
scripts/cache_features.py (`offline`: no target forward; the target's embedding and head are still
loaded, the drafter shares them; a single-process run builds or finishes a missing cache first). With `eagle.feature_norm: per_dim` the per-dimension std of the target
features on generated tokens (offline: the whole train split, from the cache; online: the first
`eagle.norm_stats_rows` train rows, kept in train.output_dir/feature_stats.safetensors) is stored in the
drafter as `feature_scale`.

Writes train.output_dir/{config.json, model.safetensors}, checkpoints/, metrics.jsonl (per-step
val/acc_step{i}, val/ce_step{i}, train/tokens_per_s), train_summary.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

import torch
from torch import nn

from headway.config import Config, load_config
from headway.data.dataset import collate, load_distilled
from headway.data.feature_cache import MANIFEST, FeatureCache, with_split_column, write_cache
from headway.data.feature_stats import FeatureMoments, generated_mask
from headway.data.features import BatchFeatures, OnlineFeatures
from headway.features import FeatureSpec, feature_key
from headway.heads.eagle import Eagle1Drafter, Eagle3Drafter, EagleDrafter
from headway.heads.eagle_objective import EagleLossConfig, build_objective
from headway.heads.vocab import build_draft_vocab, coverage
from headway.target import load_target, target_fingerprint
from headway.train.loop import NonFiniteLossError, make_accelerator, select_rows, train
from headway.train.medusa import check_data_target

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
    vocab_size = target.get_output_embeddings().weight.shape[0]
    vocab = None
    if e.draft_vocab_size is not None and e.draft_vocab_size < vocab_size:
        special = [i for i in (tok.eos_token_id, tok.pad_token_id) if i is not None]
        vocab = build_draft_vocab(train_rows, e.draft_vocab_size, vocab_size, always_include=special)
        log(
            f"draft vocabulary: {vocab.size} of {vocab_size} tokens, covering {coverage(vocab, train_rows):.2%} of answer tokens"
        )
    return Eagle3Drafter.from_target(
        target,
        feature_layers=e.feature_layers,
        vocab=vocab,
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


def ensure_feature_cache(cfg: Config, target, tok, ds, spec: FeatureSpec, accelerator) -> FeatureCache:
    """The offline cache, written (or finished) here by a single process when it is not complete yet."""
    folder = Path(cfg.eagle.feature_cache_dir)
    manifest = folder / MANIFEST
    fingerprint = target_fingerprint(target, tok, cfg.target.name)
    if not (manifest.is_file() and json.loads(manifest.read_text()).get("complete")):
        if accelerator.num_processes > 1:
            raise RuntimeError(
                f"the feature cache {folder} is not complete: build it first with one process, "
                f"`python scripts/cache_features.py --config <recipe>`"
            )
        write_cache(
            target,
            ds,
            spec,
            folder,
            max_len=cfg.train.max_seq_len,
            target_fingerprint=fingerprint,
            pad_id=tok.pad_token_id,
        )
    cache = FeatureCache(folder)
    splits = {k: ds[k] for k in ("train", "validation") if k in ds}
    cache.check(spec, fingerprint, splits, max_len=cfg.train.max_seq_len)
    return cache


def keep_only_what_offline_needs(target: nn.Module) -> None:
    """Offline training never runs the target: keep its first decoder layer (its class) and drop the rest."""
    base = target.get_decoder()
    base.layers = nn.ModuleList([base.layers[0]])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--config", required=True, help="an EAGLE recipe YAML, e.g. configs/smollm2-135m/eagle3.yaml"
    )
    parser.add_argument("overrides", nargs="*", help="section.key=value overrides, e.g. train.max_steps=50")
    parser.add_argument(
        "--cache-only", action="store_true", help="offline: only build eagle.feature_cache_dir, then stop"
    )
    args = parser.parse_args(argv)
    cfg = load_config(args.config, args.overrides)
    if cfg.eagle is None:
        parser.error(f"{args.config} has no `eagle:` section")
    e, tc = cfg.eagle, cfg.train
    dataset_dir = tc.dataset_dir or cfg.data.output_dir
    offline = e.hidden_states == "offline"
    if offline and not e.feature_cache_dir:
        parser.error(f"{args.config}: eagle.hidden_states is offline but eagle.feature_cache_dir is not set")
    if args.cache_only and not offline:
        parser.error("--cache-only needs eagle.hidden_states=offline")

    accelerator = make_accelerator(tc, device=cfg.target.device)
    target, tok = load_target(cfg.target, device=accelerator.device)
    check_data_target(dataset_dir, target, tok, cfg.target.name)
    ds = load_distilled(dataset_dir)
    train_rows, val_rows = ds["train"], ds.get("validation")
    torch.manual_seed(tc.seed)  # the drafter's initial weights: the same on every rank and every run
    drafter = build_drafter(cfg, target, tok, train_rows, log=accelerator.print)
    objective = build_objective(drafter, EagleLossConfig.from_config(e), pad_id=tok.pad_token_id)
    spec = objective.feature_spec()

    collate_fn = None
    if offline:
        cache = ensure_feature_cache(cfg, target, tok, ds, spec, accelerator)
        if args.cache_only:
            accelerator.print(
                f"feature cache complete: {cache.folder} ({cache.bytes_on_disk / 2**30:.2f} GiB)"
            )
            return 0
        keep_only_what_offline_needs(target)
        feature_source = BatchFeatures(spec)
        collate_fn = cache.collate_fn(spec, pad_id=tok.pad_token_id, max_len=tc.max_seq_len)
        train_rows = with_split_column(train_rows, "train")
        val_rows = with_split_column(val_rows, "validation") if val_rows is not None else None
        moments = cache.moments() if e.feature_norm == "per_dim" else None
        accelerator.print(f"offline features from {cache.folder} ({cache.bytes_on_disk / 2**30:.2f} GiB)")
    else:
        feature_source = OnlineFeatures(target, spec)
        moments = (
            stats_for_online_run(cfg, target, tok, train_rows, drafter.feature_spec(), accelerator)
            if e.feature_norm == "per_dim"
            else None
        )
    if moments is not None:
        std = drafter_feature_std(drafter, moments)
        drafter.set_feature_scale(std)
        accelerator.print(
            f"feature_norm per_dim: std median {std.median():.3g}, max {std.max():.3g} over {std.numel()} dimensions"
        )

    if e.version == 3 and e.calibrate_init:
        first = list(range(min(len(train_rows), tc.batch_size)))
        batch = (
            collate_fn(select_rows(train_rows, first))
            if collate_fn
            else collate(select_rows(train_rows, first), tok.pad_token_id, tc.max_seq_len)
        )
        batch = {k: v.to(accelerator.device) for k, v in batch.items()}
        c = objective.calibrate_output_scale(batch, feature_source(batch))
        accelerator.print(
            f"drafter norm initialised at {c} x the target's (least step-1 CE on the first batch)"
        )

    try:
        result = train(
            objective,
            train_rows,
            val_rows,
            tc,
            accelerator,
            pad_id=tok.pad_token_id,
            feature_source=feature_source,
            collate_fn=collate_fn,
            run_config=asdict(cfg),
        )
    except NonFiniteLossError as err:
        accelerator.print(f"error: {err}")
        return 1
    steps = sorted(k for k in result.val_metrics if k.startswith("val/acc_step"))
    accelerator.print(
        f"EAGLE-{e.version} drafter saved to {result.output_dir} after {result.step} steps; "
        + " ".join(f"{k.removeprefix('val/')}={result.val_metrics[k]:.3f}" for k in steps)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
