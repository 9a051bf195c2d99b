"""What speculative decoding can gain in llama.cpp on this machine: the verify-cost curve and the ceiling.

    curve = verify_cost(llama, "target-f16.gguf", threads=1)    # {k: seconds of a k-token forward at depth 256}
    c = ceiling(curve, alpha=[0.55, 0.4, 0.3], n_max=1)         # upper bounds on the speedup, per chain length

A verification step of a chain of n draft tokens is one target forward over n + 1 tokens; it emits
1 + (accepted) tokens. With alpha_d the acceptance at depth d given depth d - 1 was accepted, a chain of
n emits on average tau(n) = 1 + sum_{d=1..n} alpha_1 * ... * alpha_d tokens per step. Drafting for free,
the speedup over plain decoding (one 1-token forward per token) is at most tau(n) * c(1) / c(n + 1):
that is the ceiling, here per chain length and for the measured tau. The curve comes from `llama-bench
-p 1,2,4,8,16 -n 0 -d 256`: prompt batches of k tokens after a 256-token context (its depth prefill is
not timed). llama-bench asks for the last token's logits only while a verify forward needs them at every
drafted position, so the real verify cost is a little higher and the ceiling a little lower than stated.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from headway.export.serve import flash_attn_args
from headway.inference.cost import cost_at
from headway.llamacpp import LlamaCpp, LlamaCppError

SIZES = (1, 2, 4, 8, 16)
DEPTH = 256


def verify_cost(
    llama: LlamaCpp,
    gguf: str | Path,
    threads: int = 1,
    sizes=SIZES,
    depth: int = DEPTH,
    reps: int = 5,
    flash_attn: str | None = None,
) -> dict[int, float]:
    """Mean seconds of a forward over k new tokens after `depth` tokens of context, per k in `sizes`, with
    flash attention as the servers run it (-fa; None: llama.cpp's default)."""
    cmd = [str(llama.binary("llama-bench")), "-m", str(gguf), "-p", ",".join(map(str, sizes)), "-n", "0"]
    cmd += ["-d", str(depth), "-t", str(threads), "-r", str(reps), "-o", "json", *flash_attn_args(flash_attn)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise LlamaCppError(
            f"llama-bench failed (exit {res.returncode}): {' '.join(cmd)}\n{res.stderr[-2000:]}"
        )
    return parse_bench(res.stdout)


def parse_bench(text: str) -> dict[int, float]:
    """{n_prompt: seconds} from llama-bench's JSON output (prompt-processing tests only)."""
    rows = json.loads(text)
    return {
        int(r["n_prompt"]): r["avg_ns"] / 1e9
        for r in sorted(rows, key=lambda r: r["n_prompt"])
        if r["n_prompt"]
    }


def relative(curve: dict[int, float]) -> dict[int, float]:
    """Cost of a k-token forward in units of a 1-token forward."""
    base = curve[min(curve)]
    return {k: v / base for k, v in curve.items()}


def expected_tau(alpha: list[float], n: int) -> float:
    """Tokens per step of a chain of n draft tokens, with conditional acceptance alpha[d - 1] at depth d."""
    tau, reach = 1.0, 1.0
    for a in alpha[:n]:
        reach *= a
        tau += reach
    return tau


def ceiling(
    curve: dict[int, float],
    alpha: list[float],
    n_max: int,
    tau: float | None = None,
    steps: tuple[int, int, int] | None = None,
) -> dict:
    """Upper bounds on the speedup over plain decoding that the curve allows (drafting counted as free).

    per_chain: for each chain length n <= len(alpha), tau(n) from alpha and tau(n) * c(1) / c(n + 1);
    best: the best of those; measured: the measured tau (when given) over the mean verify cost per step:
    that of n_max + 1 tokens, or, given `steps` = (verification steps, steps that carried a draft, drafted
    tokens), one token for a step without draft and 1 + the mean draft length for the others (drafts cut
    by --spec-draft-p-min verify fewer tokens: the bound counts what was verified);
    alpha1_needed: the acceptance a one-token chain needs to pay at all (alpha_1 > c(2) / c(1) - 1).
    """
    rel = {k: cost_at(curve, k) / curve[min(curve)] for k in range(1, max(len(alpha), n_max) + 2)}
    per_chain = []
    for n in range(1, len(alpha) + 1):
        t = expected_tau(alpha, n)
        per_chain.append(
            {"n": n, "tau": round(t, 4), "cost": round(rel[n + 1], 4), "speedup": round(t / rel[n + 1], 4)}
        )
    out = {
        "verify_cost_relative": {str(k): round(v, 4) for k, v in relative(curve).items()},
        "per_chain": per_chain,
        "best": max(per_chain, key=lambda r: r["speedup"]) if per_chain else None,
        "alpha1_needed": round(rel[2] - 1, 4),
        "n_max": n_max,
    }
    if tau is not None:
        cost = rel[n_max + 1] if steps is None else mean_verify_cost(curve, *steps)
        out["measured"] = {"tau": round(tau, 4), "cost": round(cost, 4), "speedup": round(tau / cost, 4)}
    return out


def mean_verify_cost(curve: dict[int, float], forwards: int, draft_steps: int, drafted: int) -> float:
    """Mean cost of a verification step, in one-token forwards: steps without draft verify one token, the
    others 1 + drafted / draft_steps (interpolated on the curve; exact when every draft has one length)."""
    if not forwards or draft_steps > forwards:
        raise ValueError(f"{draft_steps} steps with a draft out of {forwards} verification steps")
    one = curve[min(curve)]
    drafted_cost = cost_at(curve, 1 + drafted / draft_steps) / one if draft_steps else 1.0
    return ((forwards - draft_steps) + draft_steps * drafted_cost) / forwards


def reached(speedup: float | None, bound: dict | None) -> float | None:
    """The share of a ceiling that a measured speedup reached."""
    if speedup is None or not bound or not bound.get("speedup"):
        return None
    return round(speedup / bound["speedup"], 4)
