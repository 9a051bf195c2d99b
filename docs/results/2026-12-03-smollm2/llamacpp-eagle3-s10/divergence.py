"""Why some llama.cpp speculative answers differ from llama.cpp plain: the numbers at each first divergence.

    python docs/results/2026-12-03-smollm2/llamacpp-eagle3-s10/divergence.py \
        --export exports/smollm2-eagle3-llamacpp --records exports/smollm2-eagle3-llamacpp/eval/records.jsonl

For every turn whose answer under a speculative configuration first differs from plain f16 at token d
(first turns only: a later turn's prompt already differs when an earlier one did), it prints the two
candidate tokens (plain's p, the speculative run's s) and their log-probabilities at position d from:
  - llama.cpp f16, one-token decode: the plain server continues prompt + plain[:d-1] by two tokens, so
    position d is scored by a one-token forward, as in plain decoding;
  - llama.cpp f16, batched forward: prompt + plain[:d] prefilled in one batch, then one token predicted,
    so position d is scored inside a many-token forward, as in a verify step;
  - headway's transformers target in fp32 (the reference).
Rounding explains a divergence when p and s are near-tied (a gap of a few hundredths of a nat or less) and
the batched forward's order of the two can differ from the one-token forward's.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from headway.config import TargetConfig
from headway.data.chat import first_turn_ids
from headway.export.serve import flash_attn_args
from headway.inference.llamacpp_eval import flash_attn_setting, read_manifest
from headway.inference.questions import load_questions
from headway.llamacpp import ensure_llamacpp
from headway.llamacpp_server import LlamaServer
from headway.target import load_target


def first_divergences(records: list[dict], plain: str) -> list[tuple[str, dict, int]]:
    by = {(r["config"], r["question_id"], r["turn"]): r for r in records}
    out = []
    for (config, qid, turn), r in by.items():
        if config.startswith("plain") or turn != 0 or config.endswith("q4_1"):
            continue
        p, s = by[(plain, qid, turn)]["tokens"], r["tokens"]
        if p != s:
            d = next((i for i, (a, b) in enumerate(zip(p, s, strict=False)) if a != b), min(len(p), len(s)))
            out.append((config, r, d))
    return out


def llama_logprobs(srv: LlamaServer, ids: list[int], n_predict: int, wanted: list[int]) -> tuple[dict, list]:
    """log p of `wanted` tokens at the last predicted position (from llama.cpp's top-100 list), and the
    tokens predicted."""
    out = srv.complete(ids, n_predict, n_probs=100, post_sampling_probs=False)
    got = {t["id"]: t["logprob"] for t in out.probs[-1]["top_logprobs"]}
    return {w: got.get(w, float("-inf")) for w in wanted}, out.tokens


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--export", required=True)
    ap.add_argument("--records", required=True)
    ap.add_argument("--questions", default="data/prompts/spec_bench/question.jsonl")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--flash-attn", help="llama.cpp -fa for the scoring server (default: the export's, as evaluated)")
    args = ap.parse_args()

    manifest = read_manifest(args.export)
    target_dir = manifest["target_folder"]
    records = [json.loads(line) for line in open(args.records)]
    questions = {q.question_id: q for q in load_questions(args.questions, 10**6)}
    cases = first_divergences(records, "plain-f16")
    model, tok = load_target(TargetConfig(name=target_dir, dtype="float32"), torch.device("cpu"))
    llama = ensure_llamacpp(log=lambda m: print(m, file=sys.stderr))
    gguf = Path(args.export) / manifest["targets"]["f16"]
    plain = {(r["question_id"], r["turn"]): r["tokens"] for r in records if r["config"] == "plain-f16"}
    print(f"{len(cases)} first-turn divergences from plain-f16 (d: first differing answer token)")
    print("config | question | d | plain tok p / spec tok s | llama.cpp one-token  lp(p) lp(s) gap |"
          " llama.cpp batched  lp(p) lp(s) gap | fp32 transformers  lp(p) lp(s) gap")  # fmt: skip
    fa = flash_attn_args(flash_attn_setting(manifest, args.flash_attn))
    with LlamaServer(llama, gguf, args.threads, 4096, extra_args=fa) as srv:
        for config, r, d in sorted(cases, key=lambda c: (c[1]["question_id"], c[0])):
            q = questions[r["question_id"]]
            prompt = first_turn_ids(tok, q.turns[0])
            ans = plain[(r["question_id"], 0)]
            p_tok, s_tok = ans[d], r["tokens"][d]
            one, toks = llama_logprobs(srv, prompt + ans[: d - 1], 2, [p_tok, s_tok])  # position d by a decode
            if toks[0] != ans[d - 1]:  # the prefill already chose another token at d-1: not plain's context
                print(f"{config} | {r['question_id']}: the prefill of plain[:{d - 1}] predicts {toks[0]}, not {ans[d - 1]}")
            batch, _ = llama_logprobs(srv, prompt + ans[:d], 1, [p_tok, s_tok])  # position d in the prefill
            with torch.no_grad():
                logits = model(torch.tensor([prompt + ans[:d]])).logits[0, -1].float()
            lp = torch.log_softmax(logits, -1)
            ref = {p_tok: lp[p_tok].item(), s_tok: lp[s_tok].item()}
            cells = [
                f"{src[p_tok]:.4f} {src[s_tok]:.4f} {src[p_tok] - src[s_tok]:+.4f}" for src in (one, batch, ref)
            ]
            print(
                f"{config} | {r['question_id']} {r['domain']} | {d} | {tok.decode([p_tok])!r} / {tok.decode([s_tok])!r}"
                f" | {cells[0]} | {cells[1]} | {cells[2]}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
