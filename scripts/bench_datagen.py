"""Generated tokens/s of the continuous-batching generator against HF `model.generate`, at equal batch size.

    python scripts/bench_datagen.py                                  # batch 64 and 128 (the data config's); SmolLM2, this machine
    python scripts/bench_datagen.py --batch-sizes 32 --rounds 3 --prompts-per-round 96 --max-new-tokens 256
    python scripts/bench_datagen.py --batch-sizes 32 --profile       # + where ours spends its time (a short run apart)

Each round draws the same prompts for both (a seeded sample of the default mix's file and passage
sources, every domain), greedy, the same max_new_tokens and stop ids. HF `generate` answers them in
static batches of `batch` prompts sorted by length (as the previous generator did: least padding);
headway's generator keeps `batch` rows busy over all of the round's prompts (refilling finished rows).
Rounds are interleaved, who goes first alternating, so machine drift hits both alike. Tokens count up
to and including each answer's EOS. The last column compares the answers token for token: equal in
fp32; in bf16 a batched forward rounds differently from another batch shape, so a few answers part
at a near-tie. Run it alone on the machine: a shared CPU spoils the figures.
"""

from __future__ import annotations

import argparse

import torch

from headway.bench import measure, mib
from headway.config import load_config
from headway.data.generate import generate_batch
from headway.data.sources import benchmark_prompts
from headway.target import load_target, stop_token_ids
from headway.tokens import cut_at_eos, left_pad

PROFILE_TOKENS = 32  # new tokens per prompt in the profiled run (--profile)


def hf_generate(model, tok, prompts, batch_size, max_new_tokens, eos_ids) -> list[list[int]]:
    """`model.generate` over `prompts` in static, length-sorted batches; the answers in prompt order."""
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    out: list[list[int]] = [[] for _ in prompts]
    for b in range(0, len(order), batch_size):
        idx = order[b : b + batch_size]
        ids, valid = left_pad([prompts[i] for i in idx], tok.pad_token_id)
        gen = model.generate(
            input_ids=ids.to(model.device),
            attention_mask=valid.long().to(model.device),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=sorted(eos_ids),
            pad_token_id=tok.pad_token_id,
        )[:, ids.shape[1] :]
        for i, row in zip(idx, gen.tolist(), strict=True):
            out[i] = cut_at_eos(row, eos_ids)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="configs/smollm2-135m/data.yaml")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--rounds", type=int, default=2, help="rounds per batch size (each method once per round)")
    ap.add_argument("--prompts-per-round", type=int, default=0, help="default: 3 x batch (so rows are refilled)")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--profile", action="store_true", help="after the rounds, profile a short run of ours (batch prompts, 32 new tokens; torch.profiler, top ops)")
    args = ap.parse_args()

    cfg = load_config(args.config)
    model, tok = load_target(cfg.target)
    eos_ids = stop_token_ids(model, tok)
    prompts = benchmark_prompts(cfg.data, tok)  # file and passage sources, seeded shuffle
    print(
        f"device {model.device}, dtype {model.dtype}, threads {torch.get_num_threads()}, "
        f"max_new_tokens {args.max_new_tokens}, greedy, {len(prompts)} prompts to draw from"
    )
    print(f"{'batch':>5} {'headway tok/s':>14} {'generate tok/s':>15} {'ratio':>6} {'peak headway':>13} "
          f"{'peak generate':>14} {'same answers':>13}")  # fmt: skip
    generate_batch(model, prompts[:2], 4, eos_ids)  # warm-up: one-time costs out of the figures
    start = 0
    for bs in args.batch_sizes:
        n = args.prompts_per_round or 3 * bs
        methods = {
            "headway": lambda b, bs=bs: [a.tokens for a in generate_batch(model, b, args.max_new_tokens, eos_ids, batch_size=bs)],
            "generate": lambda b, bs=bs: hf_generate(model, tok, b, bs, args.max_new_tokens, eos_ids),
        }
        stats = {name: {"tokens": 0, "seconds": 0.0, "peak": 0} for name in methods}
        same = total = 0
        for r in range(args.rounds):
            batch = [prompts[(start + i) % len(prompts)] for i in range(n)]
            start += n
            order = list(methods) if r % 2 == 0 else list(reversed(methods))  # alternate who goes first
            answers = {}
            for name in order:
                with measure(model.device) as m, torch.inference_mode():
                    answers[name] = methods[name](batch)
                s = stats[name]
                s["tokens"] += sum(map(len, answers[name]))
                s["seconds"] += m.seconds
                s["peak"] = max(s["peak"], m.peak_bytes)
            same += sum(a == b for a, b in zip(answers["headway"], answers["generate"], strict=True))
            total += n
        a = stats["headway"]["tokens"] / stats["headway"]["seconds"]
        b = stats["generate"]["tokens"] / stats["generate"]["seconds"]
        print(
            f"{bs:>5} {a:>14.1f} {b:>15.1f} {a / b:>5.2f}x "
            f"{mib(stats['headway']['peak']):>13} {mib(stats['generate']['peak']):>14} {same:>6}/{total:<6}",
            flush=True,
        )
        if args.profile:
            print(f"headway at batch {bs}, {bs} prompts x {PROFILE_TOKENS} new tokens, by operator:")
            print(profile_headway(model, prompts[:bs], bs, eos_ids))


def profile_headway(model, prompts, batch_size: int, eos_ids) -> str:
    """The operator table of a short run of our generator, apart from the timed rounds: the profiler
    slows what it records, and a whole round's events outgrow memory (24 GiB at batch 64, 128 tokens)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof, torch.inference_mode():
        generate_batch(model, prompts, PROFILE_TOKENS, eos_ids, batch_size=batch_size)
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15)


if __name__ == "__main__":
    main()
