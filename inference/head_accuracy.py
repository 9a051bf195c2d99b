"""Per-depth top-1..top-10 accuracy of trained heads on the validation split: the accuracy profile that
static trees and `tree_budget: auto` are built from, saved beside the checkpoint.

    python scripts/head_accuracy.py --checkpoint runs/smollm2-135m/medusa
    python scripts/head_accuracy.py --checkpoint runs/smollm2-135m/eagle3 --depth 6
    python scripts/head_accuracy.py --checkpoint DIR --config configs/smollm2-135m/medusa.yaml --max-rows 200

- Medusa: head k at position t is scored on y[t+k+1] wherever tokens t+1..t+k+1 are all
  target-generated (the training rule).
- EAGLE-1 / EAGLE-3: the drafter unrolled as at training-time test, step i scored on token t+2+i
  given the true tokens above it (inference/unrolled_accuracy.py): the acceptance of depth i+1 given
  its path was right. `--depth` steps (default: the larger of inference.depth and eagle.unroll_steps).
A label outside the draft vocabulary counts as a miss. The target and the data come from the run's
run_config.json unless --config says otherwise. Writes DIR/head_accuracy.json:
{"accuracy": [[top1..top10] per depth], "positions": [...], "per_domain": {domain: {...}}, "head": ...},
which `build_engine` reads from the checkpoint folder (the report names the file it used).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from tqdm.auto import tqdm

from headway.cli import run_main
from headway.config import Config, from_dict, load_config
from headway.data.dataset import default_collate, load_distilled, select_rows
from headway.data.features import OnlineFeatures
from headway.features import FeatureSpec
from headway.int8 import quantize_drafter
from headway.target import load_target
from headway.train.data_order import eval_batches


def run_config(args) -> Config:
    if args.config:
        return load_config(args.config, args.overrides)
    path = Path(args.checkpoint) / "run_config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: pass --config with the recipe the heads were trained with")
    raw = json.loads(path.read_text())
    raw.pop("source_file", None)
    return from_dict(Config, raw, where=str(path))


def is_eagle_folder(folder: Path) -> bool:
    from headway.heads.eagle import CONFIG_FILE, FORMAT

    path = folder / CONFIG_FILE
    if not path.is_file():
        return False
    own = json.loads(path.read_text()).get("headway")
    return isinstance(own, dict) and own.get("format") == FORMAT


def medusa_scorer(ckpt: Path, target, quantization: str = "none"):
    """(target to read features from, FeatureSpec, depth, score(batch, feats, topk) -> per depth (hits [B, k], n [B]))."""
    from headway.heads.medusa import MedusaHeads
    from headway.heads.medusa_loss import topk_hits

    heads = MedusaHeads.from_pretrained(ckpt, target=target)
    quantize_drafter(heads, quantization)  # as the engine runs them: what int8 does to accuracy
    if (ckpt / "lora" / "adapter_config.json").is_file():  # Medusa-2: the heads read the adapted target
        from peft import PeftModel

        target = PeftModel.from_pretrained(target, str(ckpt / "lora")).eval()

    def score(batch, feats, topk):
        hidden, per_row = feats.final_normed, []
        for j in range(hidden.shape[0]):  # per row, so per-domain sums are exact
            one = topk_hits(heads, hidden[j : j + 1], batch["input_ids"][j : j + 1], batch["loss_mask"][j : j + 1], topk)
            per_row.append(one)
        return [
            (torch.stack([r[k][0] for r in per_row]), torch.tensor([r[k][1] for r in per_row]))
            for k in range(heads.config.num_heads)
        ]

    info = {"head": "medusa", "draft_vocab_size": heads.config.out_size, "draft_quantization": quantization}
    return target, FeatureSpec(final_normed=True), heads.config.num_heads, score, info


def eagle_scorer(ckpt: Path, target, depth: int, pad_id: int, quantization: str = "none"):
    from headway.heads.eagle import load_drafter
    from headway.inference.unrolled_accuracy import eagle_topk_hits

    drafter = load_drafter(ckpt, target).eval()
    quantize_drafter(drafter, quantization)

    def score(batch, feats, topk):
        return eagle_topk_hits(drafter, feats, batch, depth, topk, pad_id)

    c = drafter.config
    info = {"head": f"eagle{c.version}", "draft_vocab_size": c.draft_vocab_size or c.vocab_size, "draft_quantization": quantization}
    return target, drafter.feature_spec(), depth, score, info


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True, help="heads folder: Medusa (config.json + model.safetensors, lora/) or EAGLE")
    p.add_argument("--config", help="recipe YAML (default: the checkpoint's run_config.json)")
    p.add_argument("--dataset-dir", help="distilled data folder (default: train.dataset_dir or data.output_dir)")
    p.add_argument("--split", default="validation")
    p.add_argument("--max-rows", type=int, default=None)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--topk", type=int, default=10)
    p.add_argument("--depth", type=int, help="EAGLE: unrolled steps scored (default: max(inference.depth, eagle.unroll_steps))")
    p.add_argument("--out", help="JSON path (default: CHECKPOINT/head_accuracy.json)")
    p.add_argument("overrides", nargs="*", help="section.key=value overrides for --config")
    args = p.parse_intermixed_args(argv)
    for flag, value in (("--max-rows", args.max_rows), ("--batch-size", args.batch_size), ("--topk", args.topk), ("--depth", args.depth)):
        if value is not None and value < 1:
            p.error(f"{flag} must be at least 1, got {value}")
    if not Path(args.checkpoint).is_dir():
        p.error(f"--checkpoint {args.checkpoint}: no such folder")

    cfg = run_config(args)
    target, tok = load_target(cfg.target)
    ckpt = Path(args.checkpoint)
    quant = cfg.inference.draft_quantization  # e.g. inference.draft_quantization=int8 with --config
    if is_eagle_folder(ckpt):
        unroll = cfg.eagle.unroll_steps if cfg.eagle is not None else 1
        depth = args.depth or max(cfg.inference.depth, unroll)
        target, spec, depth, score, info = eagle_scorer(ckpt, target, depth, tok.pad_token_id or 0, quant)
    else:
        target, spec, depth, score, info = medusa_scorer(ckpt, target, quant)
    features = OnlineFeatures(target, spec)
    data_dir = args.dataset_dir or cfg.train.dataset_dir or cfg.data.output_dir
    rows = load_distilled(data_dir)[args.split]
    if args.max_rows is not None:
        rows = rows.select(range(min(args.max_rows, len(rows))))
    lengths = [min(len(x), cfg.train.max_seq_len) for x in rows["input_ids"]]
    batches = eval_batches(lengths, args.batch_size)  # every row once, longest first
    collate = default_collate(tok.pad_token_id, cfg.train.max_seq_len)
    domains = rows["domain"] if "domain" in rows.column_names else ["all"] * len(rows)

    topk = args.topk
    totals: dict[str, list] = {}  # domain -> per depth [hits, n]
    for idx in tqdm(batches, desc="head accuracy"):
        batch = collate(select_rows(rows, idx))
        batch = {k: v.to(target.device) for k, v in batch.items()}
        with torch.no_grad():
            per_depth = score(batch, features(batch), topk)
        for j, i in enumerate(idx):
            for dom in ("all", domains[i]):
                acc = totals.setdefault(dom, [[torch.zeros(topk), 0] for _ in range(depth)])
                for k, (hits, n) in enumerate(per_depth):
                    acc[k][0] += hits[j].cpu()
                    acc[k][1] += int(n[j])

    def summarise(per_depth) -> dict:
        return {
            "accuracy": [[round(float(h[j]) / max(1, n), 4) for j in range(topk)] for h, n in per_depth],
            "positions": [n for _, n in per_depth],
        }

    report = {
        "checkpoint": str(ckpt),
        **info,
        "split": args.split,
        "rows": len(rows),
        "depths": depth,
        "num_heads": depth,  # Medusa's name for it
        "topk": topk,
        **summarise(totals["all"]),
        "per_domain": {d: summarise(v) for d, v in sorted(totals.items()) if d != "all"},
    }
    out = Path(args.out) if args.out else ckpt / "head_accuracy.json"
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"{'depth':>5} " + " ".join(f"top{j + 1:<4}" for j in range(topk)) + "  positions")
    for k, (accs, n) in enumerate(zip(report["accuracy"], report["positions"], strict=True), start=1):
        print(f"{k:>5} " + " ".join(f"{a:<7.3f}" for a in accs) + f"  {n}")
    print(f"written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
