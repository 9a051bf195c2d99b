"""Generated tokens/s of the self-distillation generator against plain `model.generate`, side by side.

    python scripts/bench_datagen.py                          # batch 1, 8, 32; SmolLM2 on this machine
    python scripts/bench_datagen.py --batch-sizes 8 --rounds 3 --max-new-tokens 64

Both run the same prompts (from the default SmolLM2 mix, taken in length order as the generator
batches them), greedy, same max_new_tokens and EOS, interleaved round by round so machine drift
hits both alike. Tokens count up to and including each row's EOS. Run it alone on the machine.
"""

from __future__ import annotations

import argparse

import torch

from headway.bench import measure, mib
from headway.config import load_config
from headway.data.chat import first_turn_ids
from headway.data.generate import generate_batch
from headway.data.sources import load_conversations
from headway.target import load_target
from headway.tokens import cut_at_eos, left_pad


def hf_generate(model, tok, prompts, max_new_tokens, eos_ids):
    ids, valid = left_pad(prompts, tok.pad_token_id)
    out = model.generate(
        input_ids=ids.to(model.device),
        attention_mask=valid.long().to(model.device),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=sorted(eos_ids),
        pad_token_id=tok.pad_token_id,
    )[:, ids.shape[1] :]
    return sum(len(cut_at_eos(row, eos_ids)) for row in out.tolist())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="configs/smollm2-135m/data.yaml")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--rounds", type=int, default=2, help="batches per batch size and method")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    args = ap.parse_args()

    cfg = load_config(args.config)
    model, tok = load_target(cfg.target)
    eos_ids = {tok.eos_token_id}
    convs, _ = load_conversations(cfg.data)
    prompts = [first_turn_ids(tok, c.turns[0]) for c in convs]
    prompts = [p for p in prompts if len(p) <= cfg.data.generation.max_prompt_tokens]
    print(f"device {model.device}, dtype {model.dtype}, threads {torch.get_num_threads()}, "
          f"max_new_tokens {args.max_new_tokens}, greedy")
    print(f"{'batch':>5} {'headway tok/s':>14} {'generate tok/s':>15} {'ratio':>6} {'peak headway':>13} {'peak generate':>14}")
    generate_batch(model, prompts[:2], 4, eos_ids, tok.pad_token_id)  # warm-up: one-time costs out of the figures
    for bs in args.batch_sizes:
        methods = {
            "headway": lambda b: sum(
                len(a.tokens) for a in generate_batch(model, b, args.max_new_tokens, eos_ids, tok.pad_token_id)
            ),
            "generate": lambda b: hf_generate(model, tok, b, args.max_new_tokens, eos_ids),
        }
        stats = {name: {"tokens": 0, "seconds": 0.0, "peak": 0} for name in methods}
        for r in range(args.rounds):
            batch = sorted(prompts[r * bs : (r + 1) * bs], key=len)  # length order, as the generator batches
            order = list(methods) if r % 2 == 0 else list(reversed(methods))  # alternate who goes first
            for name in order:
                with measure(model.device) as m, torch.inference_mode():
                    n = methods[name](batch)
                s = stats[name]
                s["tokens"] += n
                s["seconds"] += m.seconds
                s["peak"] = max(s["peak"], m.peak_bytes)
        a = stats["headway"]["tokens"] / stats["headway"]["seconds"]
        b = stats["generate"]["tokens"] / stats["generate"]["seconds"]
        print(
            f"{bs:>5} {a:>14.1f} {b:>15.1f} {a / b:>5.2f}x "
            f"{mib(stats['headway']['peak']):>13} {mib(stats['generate']['peak']):>14}",
            flush=True,
        )

if __name__ == "__main__":
    main()
