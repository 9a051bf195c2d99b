"""Does the EAGLE-3 draft step in llama.cpp get cheaper with one draft thread, or with a quantised draft?

    python docs/results/2026-12-03-smollm2/llamacpp-eagle3-s10/draft_threads.py \
        --export exports/smollm2-eagle3-llamacpp --per-domain 2 --max-new-tokens 128

Servers (each `--threads` threads for the target): plain f16; the drafter with the draft at the target's
threads (as scripts/evaluate_llamacpp.py runs it); the drafter with `-td 1`; the drafter with polling
off for the draft (`--poll-draft 0`). Spec-Bench prompts, every prompt through every server back to back,
order rotated. Prints tokens/s (llama.cpp's decode time), tau, and the per-step draft cost implied by
the verify-cost curve in `--curve` (a verify_cost.json of scripts/evaluate_llamacpp.py):
    step ms = tokens / (tokens/s);  draft ms = step ms - verify(1 + drafted per step) ms.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from headway.config import TargetConfig
from headway.data.chat import first_turn_ids
from headway.inference.llamacpp_eval import DRAFTER, LlamaConfig, LlamaRunner, read_manifest
from headway.inference.questions import load_questions
from headway.llamacpp import ensure_llamacpp
from headway.target import load_tokenizer


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--export", required=True)
    ap.add_argument("--questions", default="data/prompts/spec_bench/question.jsonl")
    ap.add_argument("--per-domain", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--curve", help="verify_cost.json (new tokens -> ms) to split each step into verify and draft")
    args = ap.parse_args()

    folder = Path(args.export)
    manifest = read_manifest(folder)
    draft = ("-md", str(folder.resolve() / manifest["draft"]), "--spec-draft-n-max", str(manifest["n_max"]))
    configs = [
        LlamaConfig("plain-f16", "f16"),
        LlamaConfig("eagle3", "f16", DRAFTER, draft),
        LlamaConfig("eagle3-td1", "f16", DRAFTER, (*draft, "-td", "1")),
        LlamaConfig("eagle3-nopoll", "f16", DRAFTER, (*draft, "--poll-draft", "0")),
    ]
    tok = load_tokenizer(TargetConfig(name=manifest["target_folder"]))
    questions = [q for q in load_questions(args.questions, args.per_domain)]
    llama = ensure_llamacpp(log=lambda m: print(m, file=sys.stderr))
    records = []
    with LlamaRunner(llama, folder, configs, tok, {tok.eos_token_id}, args.threads) as runner:
        runner.warm_up(first_turn_ids(tok, "Say hello."))
        for i, q in enumerate(questions):
            records += runner.run_question(q, i, args.max_new_tokens)
            print(f"{i + 1}/{len(questions)} questions", file=sys.stderr)
    curve = {int(k): 1000 * v for k, v in json.loads(Path(args.curve).read_text()).items()} if args.curve else {}
    plain_rate = None
    print(f"{'config':14} {'tok/s':>7} {'vs plain':>8} {'tau':>5} {'accept':>6} {'step ms':>8} {'draft ms':>8}")
    for c in configs:
        rs = [r for r in records if r.config == c.name]
        toks = sum(len(r.tokens) for r in rs)
        ms = sum(r.predicted_ms for r in rs)
        rate = 1000 * toks / ms
        plain_rate = plain_rate or rate
        steps = toks - sum(r.accepted for r in rs)  # one target token per step, plus the accepted drafts
        drafted = sum(r.drafted for r in rs)
        tau = toks / steps
        step_ms = ms / steps
        verify = curve.get(1 + round(drafted / steps)) if curve and c.spec_type else curve.get(1)
        draft_ms = step_ms - verify if verify is not None and c.spec_type else float("nan")
        accept = sum(r.accepted for r in rs) / drafted if drafted else float("nan")
        print(
            f"{c.name:14} {rate:7.1f} {rate / plain_rate:7.2f}x {tau:5.2f} {accept:6.2f} {step_ms:8.1f} {draft_ms:8.1f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
