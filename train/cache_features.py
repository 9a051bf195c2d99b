"""Build the target-feature cache of an offline recipe (Medusa or EAGLE), so training runs no target forward.

    python scripts/cache_features.py --config configs/smollm2-135m/eagle3.yaml
    python scripts/cache_features.py --config configs/smollm2-135m/medusa.yaml
    python scripts/cache_features.py --config configs/smollm2-135m/eagle.yaml eagle.feature_cache_dir=runs/smollm2-135m/features-eagle1
    python scripts/cache_features.py --config ... --batch-size 32 --shard-rows 256 [--overwrite]

This is the one command that builds caches (CACHE_COMMAND in train/recipe.py); a single-process
training run calls the same function when its cache is missing. A cache that already holds the recipe's
features is used as it is: the recipe's `<section>.feature_cache_dir` when set, else the dataset's own
`<data.output_dir>/features` (kept while generating when data.features names the head). Otherwise
one extraction pass writes that folder, the dataset's own with the union of the recipe's features and
what data.features names, so every head listed there trains from it and none extracts again
(manifest.json + {train,validation}/shard-*.safetensors, with the train split's per-dimension feature
statistics). Interrupt it at any time: a rerun resumes at the first unfinished shard. A cache made for
another target, dataset, feature set or max length is refused. Prints rows, tokens, time, and bytes on
disk (total and per 1,000 sequences).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from headway.cli import run_main
from headway.data.feature_cache import MANIFEST
from headway.distributed import wants_cpu
from headway.memory import keep_freed_cpu_memory
from headway.target import load_target
from headway.train.eagle import Eagle
from headway.train.medusa import Medusa
from headway.train.recipe import (
    ensure_feature_cache,
    load_checked_data,
    parse_recipe,
    recipe_parser,
    shared_feature_dir,
)

HEADS = (Medusa(), Eagle())


def parser() -> argparse.ArgumentParser:
    p = recipe_parser(__doc__, "configs/smollm2-135m/eagle3.yaml")
    p.add_argument("--out", help="cache folder (default: the recipe's feature_cache_dir, else <data.output_dir>/features)")
    p.add_argument("--batch-size", type=int, default=16, help="rows per target forward")
    p.add_argument("--shard-rows", type=int, default=256, help="rows per shard (the unit of resumption)")
    p.add_argument("--overwrite", action="store_true", help="delete an existing cache first")
    return p


def main(argv: list[str] | None = None) -> int:
    ap = parser()
    args, cfg = parse_recipe(ap, argv)
    head = next((h for h in HEADS if h.settings(cfg) is not None), None)
    if head is None:
        ap.error(f"{args.config} has no `medusa:` or `eagle:` section: nothing to cache features for")
    if args.batch_size < 1 or args.shard_rows < 1:
        ap.error(f"--batch-size and --shard-rows must be at least 1, got {args.batch_size} and {args.shard_rows}")
    out = args.out or head.settings(cfg).feature_cache_dir
    if args.overwrite:
        folder = Path(out) if out else shared_feature_dir(cfg)
        manifest = folder / MANIFEST
        if manifest.is_file() and json.loads(manifest.read_text()).get("made_by") == "generation":
            ap.error(f"{folder} holds the features kept while generating: --overwrite would delete them (pass --out)")
        if folder.exists():
            shutil.rmtree(folder)
    if wants_cpu(cfg.target.device):
        keep_freed_cpu_memory()  # reuse freed activations between forwards (see headway/memory.py)
    target, tok = load_target(cfg.target)
    ds = load_checked_data(cfg, target, tok)
    cache, report = ensure_feature_cache(
        cfg, target, tok, ds, head.feature_spec(cfg, target), out, batch_size=args.batch_size, shard_rows=args.shard_rows
    )
    spec = cache.spec
    print(f"features: layers {list(spec.layers)} final_normed={spec.final_normed} -> {cache.folder}")
    if report is None:
        return 0
    gib = report.bytes_on_disk / 2**30
    print(
        f"this run: {report.rows} rows, {report.tokens} tokens in {report.total_s:.1f} s "
        f"(target forwards {report.forward_s:.1f} s, {report.tokens / max(report.total_s, 1e-9):.0f} tokens/s); "
        f"{report.skipped_shards} shards already done"
    )
    print(
        f"on disk: {report.bytes_on_disk:,} bytes ({gib:.2f} GiB) for {report.rows_in_cache} rows = "
        f"{report.bytes_per_1000_rows / 2**20:.1f} MiB per 1,000 sequences"
    )
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
