"""Seconds to write the quickstart's self_written sources: one first-turn stream for all of them
(the writer's default) against one source after another, modes interleaved over rounds.

    ROUNDS=2 python docs/results/2026-12-07-smollm2/zen4/session37/bench_magpie.py shared,alone [prompts_per_source]
    python docs/results/2026-12-07-smollm2/zen4/session37/bench_magpie.py shared,alone 0   # the full mix

Modes: shared (all sources' first turns in one stream: the writer's default), alone (one source after
another: what the writer did before).
"""

import os
import sys
import tempfile
import time
from pathlib import Path

import torch

from headway.config import load_config
from headway.data.magpie import PromptWriter
from headway.target import load_target

modes = sys.argv[1].split(",")
per_source = int(sys.argv[2]) if len(sys.argv) > 2 else 52  # 0: the full default mix, as configured
quickstart = [f"data.max_prompts_per_source={per_source}", "data.generation.max_new_tokens=128", "data.generation.batch_size=128"]
cfg = load_config("configs/smollm2-135m/data.yaml", quickstart if per_source else [])
model, tok = load_target(cfg.target)
print(f"{per_source or 'all'} prompts per source, batch {cfg.data.generation.batch_size}, {model.dtype}, threads {torch.get_num_threads()}", flush=True)
written = {}
for rnd in range(int(os.environ.get("ROUNDS", 1))):
    for mode in modes if rnd % 2 == 0 else modes[::-1]:
        with tempfile.TemporaryDirectory() as d:
            writer = PromptWriter(model, tok, Path(d), cfg.data, log=lambda *_: None)
            wanted = writer.pending()
            t = time.perf_counter()
            with torch.inference_mode():
                if mode.startswith("alone"):
                    for w in wanted:
                        writer.write([w])
                else:
                    writer.write(wanted)
            s = time.perf_counter() - t
            convs = {name: writer(src, name, n) for src, name, n in wanted}
        dropped = sum(writer.skipped.values())
        print(f"round {rnd} {mode}: {s:.1f} s, {sum(map(len, convs.values()))} conversations, {dropped} turns dropped", flush=True)
        written.setdefault(mode, convs)
first, *others = written.values()
for mode, convs in zip(list(written)[1:], others, strict=True):
    same = sum(a == b for name in convs for a, b in zip(first[name], convs[name], strict=False))
    print(f"{mode}: {same} of {sum(map(len, convs.values()))} conversations equal to {list(written)[0]}'s (bf16 batches round differently)")
