"""What a llama.cpp EAGLE-3 draft step costs on this CPU, and the acceptance a drafter needs to beat plain.

    python docs/results/2026-12-07-smollm2/avx2/llamacpp/draft_cost.py docs/results/2026-12-07-smollm2/avx2/llamacpp/eval

From scripts/evaluate_llamacpp.py's records.jsonl and verify_cost.json: a plain token's time t1 (plain with
the f16 target, same prompts); the drafter's verification steps (tokens - accepted, each yields one token
more than it accepts), costed as the report's ceiling costs them (`mean_verify_cost`: one token for a step
without a draft, the curve at 1 + the mean draft length for the others); the rest of the drafter's decode
time, per step, is the draft.
A one-token chain then beats plain only if 1 + a > verify(2) + draft / t1.
"""

import json
import sys
from pathlib import Path

from headway.inference.llamacpp_ceiling import mean_verify_cost, relative

folder = Path(sys.argv[1])
seconds = {int(k): v for k, v in json.loads((folder / "verify_cost.json").read_text()).items()}
curve = relative(seconds)
records = [json.loads(line) for line in (folder / "records.jsonl").open()]


def total(config: str, key: str) -> float:
    return sum(r[key] for r in records if r["config"] == config)


t1 = total("plain-f16", "predicted_ms") / sum(len(r["tokens"]) for r in records if r["config"] == "plain-f16")
print("verify cost (k new tokens / one): " + ", ".join(f"{k}: {v:.2f}x" for k, v in curve.items()))
print(f"plain f16: {t1:.2f} ms a token ({1000 / t1:.1f} tokens/s)")
for config in ("eagle3-f16", "eagle3+ngram-mod"):
    tokens = sum(len(r["tokens"]) for r in records if r["config"] == config)
    accepted, drafted, draft_steps = (total(config, k) for k in ("accepted", "drafted", "draft_steps"))
    steps = tokens - accepted
    chain = drafted / max(draft_steps, 1)
    verify_units = mean_verify_cost(seconds, int(steps), int(draft_steps), int(drafted)) * steps
    ms = total(config, "predicted_ms")
    draft = (ms - verify_units * t1) / steps
    print(f"{config}: {steps:.0f} steps ({draft_steps:.0f} with a draft of {chain:.2f} tokens on average), "
          f"tau {tokens / steps:.2f}, {ms / steps:.2f} ms a step; verify {verify_units / steps:.2f} plain tokens a step; "
          f"draft and the rest {draft:.2f} ms a step = {draft / t1:.2f} plain tokens")
    if config == "eagle3-f16":
        need = curve[2] + draft / t1 - 1
        print(f"  a one-token chain beats plain only above acceptance {need:.2f} "
              f"({curve[2] - 1:.2f} with free drafting)")
