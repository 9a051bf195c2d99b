"""Is HF prompt lookup's τ lead on Spec-Bench translation the method or the text? Both rules scored on the same text.

    python docs/results/2026-12-02-smollm2/pl_same_text.py translation 10

Per first turn: plain greedy (`generate`) and HF prompt lookup (`generate(prompt_lookup_num_tokens=10)`),
its target forwards counted. Then, on each text, two lookup rules are replayed offline (greedy: a step
accepts the longest drafted prefix the text continues with, plus one token): HF's (the earliest
occurrence of the last 2, else 1, tokens; one candidate of up to 10 tokens, never past the text so
far) and ours (inference/drafters/lookup.py's NgramIndex with the recipe's settings, and two variants). The replayed HF
rule on HF's own text should reproduce HF's measured forwards; if ours replayed on the same text is at
least as high, the lead comes from the text HF's bf16 batched forwards produced, not from its rule.
τ = tokens / forwards, the prefill counted, as in the report.
"""

import sys

import torch

from headway.config import TargetConfig
from headway.data.chat import first_turn_ids
from headway.inference.drafters.lookup import NgramIndex
from headway.inference.evaluate import ForwardCounter
from headway.inference.questions import load_questions
from headway.target import load_target, stop_token_ids
from headway.tokens import cut_at_eos

MAX_NEW = 128


def hf_rule(seq: list[int], max_ngram: int = 2, num_tokens: int = 10) -> list[int]:
    """transformers' PromptLookupCandidateGenerator: the first match of the longest suffix n-gram."""
    T = len(seq)
    for n in range(min(max_ngram, T - 1), 0, -1):
        suffix = seq[T - n :]
        for i in range(T - n):
            if seq[i : i + n] == suffix:
                start, end = i + n, min(i + n + num_tokens, T)
                if start < end:
                    return seq[start:end]
    return []


OURS = {"ours": (4, 3, 3), "ours, no length cap": (4, 3, None), "ours, n<=2, 1 candidate, no cap": (2, 1, None)}


def replay(prompt: list[int], answer: list[int], rule: str) -> int:
    """Target forwards to produce `answer` (prefill included) when drafting by `rule`."""
    max_n, count, cap = OURS.get(rule, (4, 3, 3))
    idx = NgramIndex(1, max_n)
    idx.extend(prompt)
    t, forwards = 0, 1  # the prefill emits answer[0]
    while t < len(answer) - 1:
        if rule == "hf":
            cands = [hf_rule(prompt + answer[: t + 1])]
        else:
            cands = [c for _, c in idx.candidates(answer[t], 10, count, cap)]
        best = 0
        for c in cands:
            m = 0
            while m < len(c) and t + 1 + m < len(answer) and c[m] == answer[t + 1 + m]:
                m += 1
            best = max(best, m)
        idx.extend(answer[t : t + 1 + best])
        t += 1 + best
        forwards += 1
    return forwards


def main(domain: str, per_domain: int) -> None:
    model, tok = load_target(TargetConfig(name="smollm2-135m-instruct", dtype="bfloat16"))
    eos = stop_token_ids(model, tok)
    qs = [q for q in load_questions("data/prompts/spec_bench/question.jsonl", per_domain) if q.domain == domain]
    counter = ForwardCounter(model)
    sums = {k: [0, 0] for k in ("hf measured", "hf rule on hf text", "ours on hf text", "hf rule on plain", *(f"{r} on plain" for r in OURS))}
    same = 0
    print(f"{domain}: {len(qs)} first turns, {MAX_NEW} new tokens, bf16; cells: tokens/forwards")
    for q in qs:
        ids = first_turn_ids(tok, q.turns[0])
        x = torch.tensor([ids])
        texts = {}
        for name, extra in (("plain", {}), ("hf", {"prompt_lookup_num_tokens": 10})):
            counter.n = 0
            with torch.inference_mode():
                out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=MAX_NEW, do_sample=False,
                                     eos_token_id=sorted(eos), pad_token_id=tok.pad_token_id, **extra)
            texts[name] = (cut_at_eos(out[0, len(ids):].tolist(), eos), counter.n)
        hf_text, hf_forwards = texts["hf"]
        plain = texts["plain"][0]
        same += hf_text == plain
        row = {
            "hf measured": (len(hf_text), hf_forwards),
            "hf rule on hf text": (len(hf_text), replay(ids, hf_text, "hf")),
            "ours on hf text": (len(hf_text), replay(ids, hf_text, "ours")),
            "hf rule on plain": (len(plain), replay(ids, plain, "hf")),
            **{f"{r} on plain": (len(plain), replay(ids, plain, r)) for r in OURS},
        }
        for k, (a, b) in row.items():
            sums[k][0] += a
            sums[k][1] += b
        print(f"q{q.question_id}: same text {hf_text == plain}; " + "; ".join(f"{k} {a}/{b}" for k, (a, b) in row.items()), flush=True)
    print(f"HF text equals plain on {same} of {len(qs)}")
    for k, (a, b) in sums.items():
        print(f"{k:34s} tau {a / b:.2f}  ({a} tokens / {b} forwards)")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
