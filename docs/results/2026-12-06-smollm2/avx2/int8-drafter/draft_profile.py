"""Where an EAGLE-3 draft's time goes on this CPU, before int8: a drafter of the recipe's shape (untrained,
8,192-token draft vocabulary), a fixed 16-node dynamic tree, the first Spec-Bench question of three domains.

    python docs/results/2026-12-06-smollm2/avx2/int8-drafter/draft_profile.py time    # mean ms per draft call
    python docs/results/2026-12-06-smollm2/avx2/int8-drafter/draft_profile.py         # torch.profiler, self CPU time
    python docs/results/2026-12-06-smollm2/avx2/int8-drafter/draft_profile.py cprof   # cProfile, Python functions

Run before int8 existed (the recipe then had no draft_quantization): add inference.draft_quantization=none
to the overrides below to profile the same path today. Output: draft_profile.txt.
"""
import os
import sys
import tempfile
import time
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from headway.config import load_config
from headway.heads.eagle import Eagle3Drafter
from headway.heads.vocab import DraftVocab
from headway.inference.build import build_engine
from headway.inference.questions import load_questions
from headway.target import load_target

torch.manual_seed(0)
cfg = load_config("configs/smollm2-135m/eagle3.yaml", ["inference.tree_budget=16", "inference.draft_quantization=none"])
target, tok = load_target(cfg.target)
folder = os.path.join(tempfile.gettempdir(), "headway-e3-untrained")
if not os.path.exists(os.path.join(folder, "config.json")):
    d = Eagle3Drafter.from_target(target, cfg.eagle.feature_layers, vocab=DraftVocab(torch.arange(8192), 49152))
    d.save_pretrained(folder)
setup = build_engine(cfg, folder, target, tok)
eng = setup.engine
print(setup.info.get("tree"), next(target.parameters()).dtype)
prompts = []
for q in load_questions(cfg.eval.questions, per_domain=1)[:3]:
    ids = tok.apply_chat_template([{"role": "user", "content": q.turns[0]}], add_generation_prompt=True)
    prompts.append(ids if isinstance(ids, list) else ids["input_ids"])
eng.generate([prompts[0]], max_new_tokens=16)
draft = eng.drafter.draft
times = []


def labelled(*a, **k):
    t0 = time.perf_counter()
    with record_function("DRAFT"):
        r = draft(*a, **k)
    times.append(time.perf_counter() - t0)
    return r


eng.drafter.draft = labelled
if sys.argv[1:] == ["cprof"]:
    import cProfile
    import pstats

    pr = cProfile.Profile()

    def cp(*a, **k):
        pr.enable()
        r = draft(*a, **k)
        pr.disable()
        return r
    eng.drafter.draft = cp
    for ids in prompts:
        out = eng.generate([ids], max_new_tokens=48)
    pstats.Stats(pr).sort_stats("tottime").print_stats(35)
    sys.exit()
if sys.argv[1:] == ["time"]:
    for ids in prompts:
        out = eng.generate([ids], max_new_tokens=64)
    print("calls", len(times), "mean ms", 1000 * sum(times) / len(times))
    sys.exit()
with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
    for ids in prompts:
        out = eng.generate([ids], max_new_tokens=48)
totals = defaultdict(lambda: [0.0, 0])


def walk(e):
    key = e.name + (str(e.input_shapes) if e.name in ("aten::mm", "aten::linear", "mkldnn::_linear_pointwise") else "")
    totals[key][0] += e.self_cpu_time_total
    totals[key][1] += 1
    for c in e.cpu_children:
        walk(c)


calls = 0
for e in prof.events():
    if e.name == "DRAFT":
        calls += 1
        walk(e)
total = sum(v[0] for v in totals.values())
print("draft calls", calls, "per call ms", total / 1000 / calls)
for key, (us, n) in sorted(totals.items(), key=lambda kv: -kv[1][0])[:30]:
    print(f"{key[:100]:100s} {us/1000:8.1f} ms {n:6d} {us/1000/calls:.2f} ms/draft")
