"""EAGLE benchmark: training tokens/s online vs offline, feature extraction vs the bare target forward, disk use.

    python scripts/bench_eagle.py --config configs/smollm2-135m/eagle3.yaml                  # the lead's run
    python scripts/bench_eagle.py --config configs/smollm2-135m/eagle.yaml --rows 8 --steps 2 # smoke

On `--rows` rows of the recipe's training split (train.dataset_dir or data.output_dir):
1. extraction: the bare target forward (decoder only, no hooks) over length-sorted batches, then
   scripts/cache_features.py's writer over the same rows and batches (hooks, copies, safetensors
   shards); prints seconds per 1,000 sequences for both and the ratio (goal: <= 1.2x);
2. disk: bytes of the cache per 1,000 sequences (and per token);
3. draft vocabulary (EAGLE-3): share of validation answer tokens covered by the V' most frequent train
   answer tokens, for several V' (the lm_head and its training cost scale with V');
4. training: `--steps` optimizer steps of the recipe's objective (batch train.batch_size, length
   train.max_seq_len) with features online (target forward in the step) and offline (read from the
   cache); prints tokens/s (real tokens of the batches) for both. `--bf16` runs the drafter under bf16 autocast.
Nothing is written outside a temporary folder.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from contextlib import nullcontext

import torch

from headway.bench import timed
from headway.config import load_config
from headway.data.dataset import collate, load_distilled, select_rows
from headway.data.feature_cache import FeatureCache, with_split_column, write_cache
from headway.data.features import BatchFeatures, OnlineFeatures
from headway.features import eagle_feature_spec
from headway.heads.eagle_objective import EagleLossConfig, build_objective
from headway.heads.vocab import build_draft_vocab, coverage
from headway.target import load_target, target_fingerprint
from headway.train.eagle import build_drafter


def bare_forward_seconds(target, rows, pad_id: int, max_len: int, batch_size: int) -> tuple[float, int]:
    """The target's decoder over the rows, batched by length as the cache writer does; no hooks."""
    device = next(target.parameters()).device
    lengths = [min(len(x), max_len) for x in rows["input_ids"]]
    order = sorted(range(len(rows)), key=lambda i: -lengths[i])
    seconds, tokens = 0.0, 0
    with torch.no_grad():
        for b in range(0, len(order), batch_size):
            batch = collate([rows[i] for i in order[b : b + batch_size]], pad_id=pad_id, max_len=max_len)
            batch = {k: v.to(device) for k, v in batch.items()}
            with timed(device) as m:
                target.get_decoder()(
                    input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False
                )
            seconds += m.seconds
            tokens += int(batch["attention_mask"].sum())
    return seconds, tokens


def training_tokens_per_s(
    objective, batches, feature_source, device, steps: int, lr: float, bf16: bool
) -> float:
    opt = torch.optim.AdamW([p for p in objective.parameters() if p.requires_grad], lr=lr)
    objective.train()
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else nullcontext()
    seconds, tokens = 0.0, 0
    for step in range(steps + 1):  # step 0 warms up (allocations, kernels) and is not counted
        batch = {k: v.to(device) for k, v in batches[step % len(batches)]().items()}
        with timed(device) as m:
            feats = feature_source(batch)
            with autocast:
                out = objective.training_loss(batch, feats)
            out.loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        if step:
            seconds += m.seconds
            tokens += int(batch["attention_mask"].sum())
    return tokens / max(seconds, 1e-9)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True, help="an EAGLE recipe, e.g. configs/smollm2-135m/eagle3.yaml")
    ap.add_argument("--rows", type=int, default=256, help="training rows to extract and train on")
    ap.add_argument("--steps", type=int, default=10, help="optimizer steps per training measurement")
    ap.add_argument("--extract-batch-size", type=int, default=16)
    ap.add_argument("--bf16", action="store_true", help="drafter forward under bf16 autocast")
    ap.add_argument("overrides", nargs="*", help="section.key=value")
    args = ap.parse_args(argv)
    cfg = load_config(args.config, args.overrides)
    if cfg.eagle is None:
        ap.error(f"{args.config} has no `eagle:` section")
    e, tc = cfg.eagle, cfg.train
    torch.manual_seed(0)
    target, tok = load_target(cfg.target)
    device = next(target.parameters()).device
    ds = load_distilled(tc.dataset_dir or cfg.data.output_dir)
    rows = ds["train"].select(range(min(args.rows, len(ds["train"]))))
    n = len(rows)
    spec = eagle_feature_spec(
        e.version, target.config.num_hidden_layers, e.feature_layers, e.feature_source, training=True
    )
    print(
        f"EAGLE-{e.version} on {cfg.target.name} ({device}, target {next(target.parameters()).dtype}); "
        f"{n} rows, features: layers {list(spec.layers)} final_normed={spec.final_normed}"
    )

    bare_s, tokens = bare_forward_seconds(
        target, rows, tok.pad_token_id, tc.max_seq_len, args.extract_batch_size
    )
    with tempfile.TemporaryDirectory() as tmp:
        report = write_cache(
            target,
            {"train": rows},
            spec,
            tmp,
            max_len=tc.max_seq_len,
            target_fingerprint=target_fingerprint(target, tok, cfg.target.name),
            pad_id=tok.pad_token_id,
            batch_size=args.extract_batch_size,
            shard_rows=max(1, min(256, n)),
            splits=("train",),
            progress=False,
        )
        per_k = 1000 / n
        print(
            f"extraction: bare forward {bare_s * per_k:.1f} s / 1,000 seqs ({tokens / bare_s:.0f} tokens/s); "
            f"cache writer {report.total_s * per_k:.1f} s / 1,000 seqs (forwards with hooks {report.forward_s * per_k:.1f} s) "
            f"= {report.total_s / bare_s:.2f}x the bare forward (goal <= 1.2x)"
        )
        print(
            f"disk: {report.bytes_on_disk * per_k / 2**20:.1f} MiB / 1,000 seqs "
            f"({report.bytes_on_disk / max(1, report.tokens):.0f} bytes/token, {len(spec.layers) + spec.final_normed} "
            f"x {target.config.hidden_size} x {str(FeatureCache(tmp).dtype).removeprefix('torch.')})"
        )

        if e.version == 3 and "validation" in ds:
            V = target.get_output_embeddings().weight.shape[0]
            sizes = [v for v in (1024, 2048, 4096, 8192, 16384, 32768) if v < V]
            cover = []
            for v in sizes:
                vocab = build_draft_vocab(ds["train"], v, V, always_include=[tok.eos_token_id])
                cover.append(f"{v}: {coverage(vocab, ds['validation']):.1%}")
            print(
                "draft vocabulary coverage of validation answer tokens (built on train): " + ", ".join(cover)
            )

        drafter = build_drafter(cfg, target, tok, ds["train"], log=lambda *_: None)
        objective = build_objective(drafter, EagleLossConfig.from_config(e), pad_id=tok.pad_token_id)
        cache = FeatureCache(tmp)
        cached_collate = cache.collate_fn(spec, tok.pad_token_id, tc.max_seq_len)
        split_rows = with_split_column(rows, "train")
        bs = tc.batch_size
        index_batches = [list(range(i, min(n, i + bs))) for i in range(0, n, bs)]
        plain = [
            lambda idx=idx: collate(select_rows(rows, idx), tok.pad_token_id, tc.max_seq_len)
            for idx in index_batches
        ]
        cached = [lambda idx=idx: cached_collate(select_rows(split_rows, idx)) for idx in index_batches]
        online = training_tokens_per_s(
            objective, plain, OnlineFeatures(target, spec), device, args.steps, tc.lr, args.bf16
        )
        offline = training_tokens_per_s(
            objective, cached, BatchFeatures(spec), device, args.steps, tc.lr, args.bf16
        )
    print(
        f"training (batch {bs}, max_len {tc.max_seq_len}, unroll {e.unroll_steps if e.version == 3 else 1}, "
        f"{'bf16 autocast' if args.bf16 else 'fp32'}): online {online:.0f} tokens/s, offline {offline:.0f} tokens/s "
        f"({offline / online:.2f}x)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
