"""Rerun the drafter's differing prompts in llama.cpp: is the divergence reproducible, and what do the two
candidates score in llama.cpp plain f16 at that position (one-token decode vs batched prefill)?

    python docs/results/2026-12-03-smollm2/llamacpp-eagle3-s10/divergence_rerun.py   # about 2 minutes

Servers as scripts/evaluate_llamacpp.py starts them (2 threads, -c 8192: the target's context), the
drafter with q8_0 draft and one draft token per step. Also: the same drafter server asked for n_probs
(top log-probabilities), which changes its answer at the divergence.
"""

import json
from pathlib import Path

from headway.config import TargetConfig
from headway.data.chat import first_turn_ids
from headway.inference.llamacpp_eval import read_manifest
from headway.inference.questions import load_questions
from headway.llamacpp import ensure_llamacpp
from headway.llamacpp_server import LlamaServer
from headway.target import load_tokenizer

FOLDER = Path("exports/smollm2-eagle3-llamacpp")
QUESTIONS = (151, 242, 248, 250, 330, 488)


def logprobs(out, wanted):
    got = {t["id"]: t["logprob"] for t in out.probs[-1]["top_logprobs"]}
    return [got.get(w) for w in wanted]


def main():
    m = read_manifest(FOLDER)
    tok = load_tokenizer(TargetConfig(name=m["target_folder"]))
    qs = {q.question_id: q for q in load_questions("data/prompts/spec_bench/question.jsonl", 10**6)}
    recs = [json.loads(line) for line in open(FOLDER / "eval/records.jsonl")]
    recorded = {(r["config"], r["question_id"]): r["tokens"] for r in recs if r["turn"] == 0}
    llama, target = ensure_llamacpp(), FOLDER / m["targets"]["f16"]
    draft = ["-md", str(FOLDER.resolve() / m["draft"]), "--spec-type", "draft-eagle3", "--spec-draft-n-max", "1"]
    prompts = {q: first_turn_ids(tok, qs[q].turns[0]) for q in QUESTIONS}
    spec, spec_probs = {}, {}
    with LlamaServer(llama, target, 2, 8192, draft) as srv:
        for q in QUESTIONS:
            spec[q] = srv.complete(prompts[q], 128).tokens
            spec_probs[q] = srv.complete(prompts[q], 128, n_probs=1).tokens
    with LlamaServer(llama, target, 2, 8192) as srv:
        for q in QUESTIONS:
            plain = srv.complete(prompts[q], 128).tokens
            rec = recorded[("eagle3-f16", q)]
            d = next((i for i, (a, b) in enumerate(zip(plain, spec[q], strict=False)) if a != b), None)
            print(f"question {q}: plain equals the recorded plain run {plain[: len(rec)] == recorded[('plain-f16', q)][: len(rec)]}, "
                  f"drafter equals the recorded drafter run {spec[q][: len(rec)] == rec}, "
                  f"drafter asked for n_probs equals plain {spec_probs[q] == plain}")  # fmt: skip
            if d is None:
                continue
            p, s = plain[d], spec[q][d]
            one = logprobs(srv.complete(prompts[q] + plain[: d - 1], 2, n_probs=100), [p, s])
            batch = logprobs(srv.complete(prompts[q] + plain[:d], 1, n_probs=100), [p, s])
            print(f"  first difference at answer token {d}: plain {tok.decode([p])!r}, drafter {tok.decode([s])!r}; "
                  f"log p one-token {one[0]:.4f} / {one[1]:.4f} (gap {one[0] - one[1]:+.4f}), "
                  f"batched {batch[0]:.4f} / {batch[1]:.4f} (gap {batch[0] - batch[1]:+.4f})")  # fmt: skip


if __name__ == "__main__":
    main()
