"""The generator's greedy argmax over fp32 logits (a63a6b0) against over the bf16 logits (before), on the
mix's prompts at batch 128 with features kept; rounds interleaved, order alternating. The bf16 variant is
the method's source with `.float()` removed. Also how many answers the two give equally (a bf16 argmax need
not pick the first of tied logits; HF generate takes its argmax in fp32).

    python docs/results/2026-12-03-smollm2/argmax_ab.py 256 128 2     # prompts, tokens, rounds

Session eight, at 44859dd, alone (argmax_ab.txt): fp32 325 against bf16 330 tokens/s, answers 256/256 equal.
The 5 ms a step the micro-benchmark saved does not show in the run, so the generator's argmax is back on
the bf16 logits; this script needs the fp32 line to run (44859dd or earlier back to a63a6b0).
"""

import inspect
import sys
import textwrap
import time

import headway.data.generate as G
from headway.config import load_config
from headway.data.distill import data_feature_spec
from headway.data.sources import benchmark_prompts
from headway.target import load_target, stop_token_ids

cfg = load_config("configs/smollm2-135m/data.yaml")
model, tok = load_target(cfg.target)
eos = stop_token_ids(model, tok)
prompts = benchmark_prompts(cfg.data, tok)
N, MAX_NEW, ROUNDS = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
capture = data_feature_spec(cfg.data.features, model.config.num_hidden_layers)
fp32 = G.Generator._advance
src = textwrap.dedent(inspect.getsource(fp32))
assert "logits.float().argmax(-1)" in src
ns: dict = {}
exec(src.replace("logits.float().argmax(-1)", "logits.argmax(-1)"), vars(G), ns)
arms = {"fp32": fp32, "bf16": ns["_advance"]}
G.generate_batch(model, prompts[-4:], 8, eos)
res = {a: [0, 0.0] for a in arms}
for r in range(ROUNDS):
    batch = prompts[r * N : (r + 1) * N]
    answers = {}
    for a in list(arms) if r % 2 == 0 else list(arms)[::-1]:
        G.Generator._advance = arms[a]
        got = {}
        jobs = [G._OneAnswer(i, G.Turn(list(p), 0), got.__setitem__) for i, p in enumerate(batch)]
        t = time.perf_counter()
        G.Generator(model, 128, MAX_NEW, eos, capture=capture).run(jobs)
        el = time.perf_counter() - t
        toks = sum(len(x.tokens) for x in got.values())
        answers[a] = got
        res[a][0] += toks
        res[a][1] += el
        print(f"round {r} argmax {a}: {toks} tokens in {el:.1f}s = {toks / el:.0f} tok/s", flush=True)
    same = sum(answers["fp32"][i].tokens == answers["bf16"][i].tokens for i in answers["fp32"])
    print(f"round {r}: answers equal {same}/{len(batch)}")
for a, (t, e) in res.items():
    print(f"TOTAL argmax {a}: {t / e:.0f} tok/s")
