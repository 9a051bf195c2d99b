"""Throughput at batch 1, 4, 8: speculative decoding with ragged acceptance vs plain batched `generate`.

    python scripts/bench_batch.py --config configs/smollm2-135m/medusa.yaml --checkpoint runs/smollm2-135m/medusa
    python scripts/bench_batch.py --config configs/smollm2-135m/eagle3.yaml --checkpoint DIR --batch-sizes 1 4 8 \\
        --prompts 24 --max-new-tokens 128 --out runs/eval/eagle3

The same prompts (first turns of Spec-Bench, spread over the domains) run at each batch size, each
chunk plain then speculative, back to back. Tokens count up to and including each row's EOS.
Writes OUT/batch.json and prints the table.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from tqdm.auto import tqdm

from headway.bench import timed
from headway.config import load_config
from headway.data.chat import first_turn_ids
from headway.inference.build import build_engine
from headway.inference.questions import load_questions
from headway.paths import resolve_path
from headway.target import load_target
from headway.tokens import cut_at_eos, left_pad


@torch.inference_mode()
def plain_batch(model, prompts, max_new, eos, pad) -> tuple[list[list[int]], float]:
    device = next(model.parameters()).device
    ids, valid = left_pad(prompts, pad)
    with timed(device) as m:
        out = model.generate(
            ids.to(device),
            attention_mask=valid.long().to(device),
            max_new_tokens=max_new,
            do_sample=False,
            eos_token_id=sorted(eos),
            pad_token_id=pad,
        )
    return [cut_at_eos(row[ids.shape[1] :].tolist(), eos) for row in out], m.seconds


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True)
    p.add_argument("--checkpoint")
    p.add_argument("--layer-skip", type=int)
    p.add_argument("--prompts", type=int, default=24)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--batch-sizes", type=int, nargs="+")
    p.add_argument("--out")
    p.add_argument("overrides", nargs="*")
    args = p.parse_args(argv)

    cfg = load_config(args.config, args.overrides)
    sizes = args.batch_sizes or cfg.eval.batch_sizes
    target, tok = load_target(cfg.target)
    device = next(target.parameters()).device
    setup = build_engine(cfg, args.checkpoint, target, tok, layer_skip=args.layer_skip)
    engine, model = setup.engine, setup.target
    eos = {tok.eos_token_id} | engine.eos_ids
    engine.eos_ids = eos
    qs = load_questions(resolve_path(cfg.eval.questions), per_domain=-(-args.prompts // 6))
    prompts = [first_turn_ids(tok, q.turns[0]) for q in qs][: args.prompts]
    plain_batch(model, prompts[:2], 4, eos, tok.pad_token_id)  # warm up
    engine.generate(prompts[:2], 4)

    rows = []
    for bs in sizes:
        tot = {"plain_tokens": 0, "plain_s": 0.0, "spec_tokens": 0, "spec_s": 0.0, "identical": 0}
        for i in tqdm(range(0, len(prompts), bs), desc=f"batch {bs}"):
            chunk = prompts[i : i + bs]
            ref, dt = plain_batch(model, chunk, args.max_new_tokens, eos, tok.pad_token_id)
            tot["plain_tokens"] += sum(map(len, ref))
            tot["plain_s"] += dt
            with timed(device) as m:
                out = engine.generate(chunk, args.max_new_tokens)
            tot["spec_s"] += m.seconds
            tot["spec_tokens"] += sum(map(len, out.tokens))
            tot["identical"] += sum(a == b for a, b in zip(out.tokens, ref, strict=True))
        plain_tps, spec_tps = tot["plain_tokens"] / tot["plain_s"], tot["spec_tokens"] / tot["spec_s"]
        rows.append(
            {
                "batch": bs,
                **tot,
                "plain_tokens_per_s": plain_tps,
                "spec_tokens_per_s": spec_tps,
                "speedup": spec_tps / plain_tps,
            }
        )

    result = {
        "method": setup.method,
        "checkpoint": args.checkpoint,
        "device": str(device),
        "dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
        "tree": setup.info["tree"],
        "budget": setup.info["budget"],
        "prompts": len(prompts),
        "max_new_tokens": args.max_new_tokens,
        "rows": rows,
    }
    print("| batch | plain tok/s | spec tok/s | speedup | identical |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['batch']} | {r['plain_tokens_per_s']:.1f} | {r['spec_tokens_per_s']:.1f} | {r['speedup']:.2f}x | {r['identical']}/{len(prompts)} |"
        )
    out_dir = Path(args.out or (Path(args.checkpoint) / "eval" if args.checkpoint else "runs/eval"))
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "batch.json").write_text(json.dumps(result, indent=1) + "\n")
    print(f"written to {out_dir}/batch.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
