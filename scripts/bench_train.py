"""Training throughput of Medusa heads on the real target, beside the bare target forward over the same tokens.

    python scripts/bench_train.py                                   # SmolLM2-135M, batch 8 x 512 tokens
    python scripts/bench_train.py --variants medusa1 medusa1-cached medusa1-full medusa2 --rounds 3
    python scripts/bench_train.py --batch-size 1 --seq-len 64 --steps 1 --rounds 1   # smoke test (seconds)

One training step = what train/loop.py does per micro-batch: the target's forward for features (no
lm_head, no grad), the heads' loss, backward, clip, AdamW step; "medusa1-cached" is the same step on
features extracted beforehand (medusa.hidden_states: offline, every epoch after the cache is built);
"medusa1-full" uses the full vocabulary; "medusa2" adds LoRA and the KL. "forward" is the plain
`model(input_ids)` a user would run (with lm_head, no grad). Every variant runs the same batches (the
distilled validation rows when the recipe's data exist, else synthetic rows), interleaved round by round
so machine drift hits all alike. Printed: tokens/s, ms per batch, the ratio to the bare forward (goal for
Medusa-1 with the reduced vocabulary: <= 1.5x), peak memory. Run it alone on the machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random

import torch

from headway.bench import measure, mib
from headway.config import load_config
from headway.data.dataset import collate
from headway.data.features import OnlineFeatures
from headway.heads.medusa import MedusaHeads
from headway.heads.medusa_loss import Medusa2Objective, MedusaObjective, teacher_rows
from headway.heads.vocab import build_draft_vocab
from headway.target import load_target
from headway.train.loop import ObjectiveModule, make_accelerator
from headway.train.optim import build_optimizer, default_param_groups

VARIANTS = ("medusa1", "medusa1-cached", "medusa1-full", "medusa2")


def bench_rows(cfg, n: int, seq_len: int, vocab_size: int, seed: int = 0) -> list[dict]:
    """Real distilled rows (cut to seq_len) when the recipe's data exist, else synthetic chat-shaped rows."""
    try:
        from headway.data.dataset import load_distilled

        ds = load_distilled(cfg.data.output_dir)
        split = ds["validation"] if len(ds["validation"]) >= n else ds["train"]
        rows = [dict(input_ids=r["input_ids"][:seq_len], loss_mask=r["loss_mask"][:seq_len]) for r in split.select(range(n))]
        print(f"rows: {n} distilled rows from {cfg.data.output_dir} (cut to {seq_len} tokens)")
        return rows
    except FileNotFoundError:
        rng = random.Random(seed)
        print(f"rows: {n} synthetic rows of {seq_len} tokens (no distilled data at {cfg.data.output_dir})")
        prompt = seq_len // 3
        return [
            dict(input_ids=[rng.randrange(3, vocab_size) for _ in range(seq_len)], loss_mask=[0] * prompt + [1] * (seq_len - prompt))
            for _ in range(n)
        ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="configs/smollm2-135m/medusa.yaml")
    p.add_argument("--variants", nargs="+", default=["medusa1", "medusa1-full"], choices=VARIANTS)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--steps", type=int, default=3, help="batches per variant per round")
    p.add_argument("--rounds", type=int, default=2, help="timed rounds (after one warm-up round)")
    p.add_argument("--mixed-precision", choices=["auto", "no", "bf16", "fp16"], default=None, help="default: the recipe's")
    p.add_argument("--json", help="also write the figures to this file")
    p.add_argument("overrides", nargs="*", help="section.key=value overrides for the recipe")
    args = p.parse_args(argv)

    cfg = load_config(args.config, args.overrides)
    if cfg.medusa is None:
        p.error(f"{args.config} has no medusa section")
    tc = dataclasses.replace(cfg.train, mixed_precision=args.mixed_precision or cfg.train.mixed_precision)
    accelerator = make_accelerator(tc, device=cfg.target.device)
    target, tok = load_target(cfg.target, device=accelerator.device)
    device = accelerator.device
    V = target.get_output_embeddings().weight.shape[0]
    rows = bench_rows(cfg, args.batch_size * args.steps, args.seq_len, V)
    batches = [
        {k: v.to(device) for k, v in collate(rows[i : i + args.batch_size], tok.pad_token_id, args.seq_len).items()}
        for i in range(0, len(rows), args.batch_size)
    ]
    n_tokens = sum(int(b["attention_mask"].sum()) for b in batches)
    m = cfg.medusa
    print(
        f"target {cfg.target.name} ({target.dtype}) on {device}; {len(batches)} batches x {args.batch_size} rows, "
        f"{n_tokens} tokens; {m.num_heads} heads, soft labels {m.soft_label_weight}, mixed precision {tc.mixed_precision}"
    )

    def forward_step(batch):
        with torch.no_grad():
            target(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False)

    def make_train_step(variant: str):
        vocab = None
        if variant != "medusa1-full" and m.draft_vocab_size and m.draft_vocab_size < V:
            vocab = build_draft_vocab(rows, m.draft_vocab_size, V, always_include=[tok.eos_token_id])
        heads = MedusaHeads.from_target(target, m.num_heads, m.num_layers, vocab=vocab, fc_bias=m.fc_bias)
        if variant == "medusa2":
            from peft import LoraConfig, get_peft_model

            lora = LoraConfig(r=m.lora_r, lora_alpha=m.lora_alpha, target_modules=list(m.lora_target_modules))
            objective, source = Medusa2Objective(get_peft_model(target, lora), heads, m.loss_decay, m.medusa2_lambda), None
        else:
            objective = MedusaObjective(heads, m.loss_decay, teacher_rows(heads, target), m.soft_label_weight)
            source = OnlineFeatures(target, objective.feature_spec())
            if variant == "medusa1-cached":  # extracted once, outside the timed steps
                cached = {id(b): source(b) for b in batches}
                source = lambda b: cached[id(b)]  # noqa: E731
        module = ObjectiveModule(objective)
        groups = objective.param_groups(tc.lr) if hasattr(objective, "param_groups") else default_param_groups(module, tc.lr)
        model, optimizer = accelerator.prepare(module, build_optimizer(groups, tc))

        def step(batch):
            feats = source(batch) if source is not None else None
            out = model(batch, feats.as_dict() if feats is not None else {})
            accelerator.backward(out["loss"])
            accelerator.clip_grad_norm_(model.parameters(), tc.grad_clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        return step

    steps = {"forward": forward_step}
    for v in args.variants:  # medusa2 wraps the target with adapters: build it last
        steps[v] = make_train_step(v)
    order = ["forward"] + [v for v in VARIANTS if v in args.variants]

    seconds = {k: 0.0 for k in order}
    peak = {k: 0 for k in order}
    for r in range(args.rounds + 1):  # round 0 warms up (allocations, kernels) and is not counted
        for name in order:
            with measure(device) as meas:
                for batch in batches:
                    steps[name](batch)
            if r > 0:
                seconds[name] += meas.seconds
                peak[name] = max(peak[name], meas.peak_bytes)

    base = seconds["forward"] / args.rounds
    results = {}
    print(f"\n{'variant':<14} {'tokens/s':>10} {'ms/batch':>9} {'x forward':>9} {'peak mem':>10}")
    for name in order:
        t = seconds[name] / args.rounds
        results[name] = {
            "tokens_per_s": n_tokens / t,
            "ms_per_batch": 1000 * t / len(batches),
            "ratio_to_forward": t / base,
            "peak_bytes": peak[name],
        }
        print(f"{name:<14} {n_tokens / t:>10.0f} {1000 * t / len(batches):>9.1f} {t / base:>9.2f} {mib(peak[name]):>10}")
    if "medusa1" in results and m.draft_vocab_size:
        ok = results["medusa1"]["ratio_to_forward"] <= 1.5
        print(f"\ngoal (Medusa-1, draft vocab {m.draft_vocab_size}: step <= 1.5x the bare forward): {'met' if ok else 'NOT met'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"config": args.config, "batch_size": args.batch_size, "seq_len": args.seq_len, "results": results}, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
