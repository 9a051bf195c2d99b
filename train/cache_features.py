"""Cache the target features an EAGLE recipe trains on, so training runs no target forward.

    python scripts/cache_features.py --config configs/smollm2-135m/eagle3.yaml
    python scripts/cache_features.py --config configs/smollm2-135m/eagle.yaml eagle.feature_cache_dir=runs/smollm2-135m/features-eagle1
    python scripts/cache_features.py --config ... --batch-size 32 --shard-rows 256 [--overwrite]

Writes eagle.feature_cache_dir (manifest.json + {train,validation}/shard-*.safetensors, with the train
split's per-dimension feature statistics). Interrupt it at any time: a rerun resumes at the first
unfinished shard. A cache made for another target, dataset, feature set or max length is refused.
Prints rows, tokens, time, and bytes on disk (total and per 1,000 sequences).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from headway.config import ConfigError, load_config
from headway.data.dataset import load_distilled
from headway.data.feature_cache import StaleCacheError, write_cache
from headway.distributed import wants_cpu
from headway.heads.eagle import eagle_feature_spec
from headway.memory import keep_freed_cpu_memory
from headway.target import load_target, target_fingerprint


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True, help="an EAGLE recipe, e.g. configs/smollm2-135m/eagle3.yaml")
    ap.add_argument("--out", help="cache folder (default: eagle.feature_cache_dir)")
    ap.add_argument("--batch-size", type=int, default=16, help="rows per target forward")
    ap.add_argument("--shard-rows", type=int, default=256, help="rows per shard (the unit of resumption)")
    ap.add_argument("--overwrite", action="store_true", help="delete an existing cache first")
    ap.add_argument("overrides", nargs="*", help="section.key=value")
    args = ap.parse_args(argv)
    try:
        cfg = load_config(args.config, args.overrides)
        if cfg.eagle is None:
            raise ConfigError(f"{args.config} has no `eagle:` section")
        out = args.out or cfg.eagle.feature_cache_dir
        if not out:
            raise ConfigError(f"{args.config}: set eagle.feature_cache_dir (or pass --out)")
        if args.overwrite and Path(out).exists():
            shutil.rmtree(out)
        if wants_cpu(cfg.target.device):
            keep_freed_cpu_memory()  # reuse freed activations between forwards (see headway/memory.py)
        target, tok = load_target(cfg.target)
        e = cfg.eagle
        spec = eagle_feature_spec(
            e.version, target.config.num_hidden_layers, e.feature_layers, e.feature_source, training=True
        )
        ds = load_distilled(cfg.train.dataset_dir or cfg.data.output_dir)
        report = write_cache(
            target,
            ds,
            spec,
            out,
            max_len=cfg.train.max_seq_len,
            target_fingerprint=target_fingerprint(target, tok, cfg.target.name),
            pad_id=tok.pad_token_id,
            batch_size=args.batch_size,
            shard_rows=args.shard_rows,
        )
    except (ConfigError, StaleCacheError, FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    gib = report.bytes_on_disk / 2**30
    print(f"features: layers {list(spec.layers)} final_normed={spec.final_normed} -> {report.folder}")
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
    sys.exit(main())
