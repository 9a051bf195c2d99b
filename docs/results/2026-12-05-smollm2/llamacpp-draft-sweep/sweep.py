"""llama.cpp draft settings for the headway EAGLE-3 drafter (issue 16): chain length, p-min, draft threads.

    python docs/results/2026-12-05-smollm2/llamacpp-draft-sweep/sweep.py 3                 # sweep1.txt
    python docs/results/2026-12-05-smollm2/llamacpp-draft-sweep/sweep.py 3 1:0.5 2:0.6 +2:0.6   # N:P drafter, +N:P with ngram-mod

Plain f16 and ngram-mod, then by default (sweep1.txt) the drafter as exported (one token per step), with
--spec-draft-p-min and longer chains, with one draft thread, and the drafter + ngram-mod; or the drafter
settings given (N:P: --spec-draft-n-max N --spec-draft-p-min P; +N:P the same combined with ngram-mod).
Spec-Bench 3 per domain by default,
128 tokens, two threads per server, interleaved per prompt (inference/llamacpp_eval.py), summed with the
report's own summarize_config (identical answers counted against plain f16). Every server runs with the
export's flash attention setting (`flash_attn` in headway_llamacpp.json): sweeps 1-4 ran before exports
wrote it (llama.cpp's default, on); sweep5-fa-off.txt ran with `-fa off`:

    python docs/results/2026-12-05-smollm2/llamacpp-draft-sweep/sweep.py 3 3:0.5 3:0.4 3:0.3 2:0.4 4:0.5 +3:0.4
"""

import json
import sys
from collections import defaultdict
from pathlib import Path

from headway.config import TargetConfig
from headway.data.chat import first_turn_ids
from headway.export.serve import flash_attn_args
from headway.inference.llamacpp_eval import (
    DRAFTER,
    LlamaConfig,
    LlamaRunner,
    eos_ids,
    flash_attn_setting,
    read_manifest,
)
from headway.inference.llamacpp_report import summarize_config
from headway.inference.questions import load_questions
from headway.llamacpp import ensure_llamacpp
from headway.target import load_tokenizer

PER_DOMAIN = int(sys.argv[1]) if len(sys.argv) > 1 else 3
EXPORT = Path("exports/smollm2-eagle3-llamacpp")
manifest = read_manifest(EXPORT)
md = ("-md", str(EXPORT.resolve() / manifest["draft"]))
fa = flash_attn_args(flash_attn_setting(manifest))  # every server as the export serves (sweeps 1-4: default, on)


def drafter(n: int, p: float, *extra: str, spec: str = DRAFTER) -> LlamaConfig:
    args = (*md, "--spec-draft-n-max", str(n), "--spec-draft-p-min", str(p), *extra, *fa)
    name = f"{spec.replace('draft-', '')} n{n} p{p:g}" + (" " + " ".join(extra) if extra else "")
    return LlamaConfig(name, "f16", spec, args)


def from_spec(text: str) -> LlamaConfig:
    n, p = text.lstrip("+").split(":")
    return drafter(int(n), float(p), spec=f"{DRAFTER},ngram-mod" if text.startswith("+") else DRAFTER)


configs = [LlamaConfig("plain-f16", "f16", None, fa), LlamaConfig("ngram-mod", "f16", "ngram-mod", fa)]
configs += [from_spec(s) for s in sys.argv[2:]] or [
    drafter(1, 0.0),
    drafter(1, 0.4),
    drafter(1, 0.5),
    drafter(2, 0.5),
    drafter(3, 0.7),
    drafter(1, 0.4, "--spec-draft-threads", "1"),
    drafter(1, 0.4, spec=f"{DRAFTER},ngram-mod"),
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
plain = summarize_config(by_cfg["plain-f16"], None)
out = {}
for c in configs:
    s = out[c.name] = summarize_config(by_cfg[c.name], None if c.spec_type is None else by_cfg["plain-f16"])
    s.pop("divergences", None)
    ident = f"{s['identical']}/{s['compared']}" if "identical" in s else "-"
    print(
        f"{c.name:42s} {s['tokens_per_s']:6.1f} tokens/s  {s['tokens_per_s'] / plain['tokens_per_s']:.3f}x  "
        f"tau {s['tau']:.2f}  accepted {s['accepted']}/{s['drafted']} in {s['draft_steps']} steps  identical {ident}"
    )
print(json.dumps(out))
