"""Flash attention on or off in llama.cpp on this CPU (issue 16): plain, ngram-mod and the drafter, interleaved.

    python docs/results/2026-12-05-smollm2/llamacpp-flash-attn/fa.py 3      # fa3.txt: Spec-Bench 3 per domain

llama.cpp's default `-fa auto` turns flash attention on for the CPU backend. llama-bench here shows it
slower as the context grows (tg128 f16: 47.0 at depth 0, 35.1 at depth 256 with it; 44.5 / 42.4 without),
and a forward over 2 tokens at depth 256 costing 1.32x one token with it, 1.10x without. This measures what
that does to plain decoding and to speculation on Spec-Bench prompts: every configuration with `-fa on`
(what the default picks) and `-fa off`, the same prompts, interleaved per prompt, 128 tokens, two threads.
Ratios are over plain f16 with flash attention (the previous baseline) and over plain f16 without it.
"""

import json
import sys
from collections import defaultdict
from pathlib import Path

from headway.config import TargetConfig
from headway.data.chat import first_turn_ids
from headway.inference.llamacpp_eval import DRAFTER, LlamaConfig, LlamaRunner, eos_ids, read_manifest
from headway.inference.llamacpp_report import summarize_config
from headway.inference.questions import load_questions
from headway.llamacpp import ensure_llamacpp
from headway.target import load_tokenizer

PER_DOMAIN = int(sys.argv[1]) if len(sys.argv) > 1 else 3
EXPORT = Path("exports/smollm2-eagle3-llamacpp")
manifest = read_manifest(EXPORT)
draft = ("-md", str(EXPORT.resolve() / manifest["draft"]), "--spec-draft-n-max", "3", "--spec-draft-p-min", "0.5")

configs = []
for fa in ("on", "off"):
    flag = ("-fa", fa)
    configs += [
        LlamaConfig(f"plain-f16 fa-{fa}", "f16", None, flag),
        LlamaConfig(f"plain-q4_1 fa-{fa}", "q4_1", None, flag),
        LlamaConfig(f"ngram-mod fa-{fa}", "f16", "ngram-mod", flag),
        LlamaConfig(f"eagle3 n3 p0.5 fa-{fa}", "f16", DRAFTER, (*draft, *flag)),
        LlamaConfig(f"eagle3+ngram-mod fa-{fa}", "f16", f"{DRAFTER},ngram-mod", (*draft, *flag)),
    ]
target_dir = Path(manifest["target_folder"])
tok = load_tokenizer(TargetConfig(name=str(target_dir)))
questions = load_questions("data/prompts/spec_bench/question.jsonl", PER_DOMAIN)
records = []
with LlamaRunner(ensure_llamacpp(), EXPORT, configs, tok, eos_ids(target_dir, tok), 2, 8192) as runner:
    runner.warm_up(first_turn_ids(tok, "Say hello."))
    for i, q in enumerate(questions):
        records += runner.run_question(q, i, 128)
        print(f"question {i + 1}/{len(questions)}", flush=True)
by_cfg = defaultdict(list)
for r in records:
    by_cfg[r.config].append(r)
base = {fa: summarize_config(by_cfg[f"plain-f16 fa-{fa}"], None) for fa in ("on", "off")}
out = {}
for c in configs:
    fa = c.name.rsplit("fa-", 1)[1]
    same = f"plain-{c.target} fa-{fa}"
    s = out[c.name] = summarize_config(by_cfg[c.name], None if c.spec_type is None else by_cfg[same])
    s.pop("divergences", None)
    ident = f"{s['identical']}/{s['compared']}" if "identical" in s else "-"
    print(
        f"{c.name:28s} {s['tokens_per_s']:6.1f} tokens/s  {s['tokens_per_s'] / base['on']['tokens_per_s']:.3f}x of "
        f"plain-f16 fa-on  {s['tokens_per_s'] / base['off']['tokens_per_s']:.3f}x of plain-f16 fa-off  "
        f"tau {s['tau']:.2f}  accepted {s['accepted']}/{s['drafted']}  identical to {same} {ident}"
    )
print(json.dumps(out))
