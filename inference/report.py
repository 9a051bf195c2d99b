"""Per-domain evaluation report: tau, alpha per depth, accepted-length histogram, measured speedups.

Definitions (what `report.json` holds per domain and `overall`):
- tau: mean tokens emitted per verification forward, the bonus token included (1 + mean accepted).
  The prefill's first token is not counted, nor its forward.
- alpha[d-1]: P(the depth-d draft token is accepted | depth d-1 was), over verifications.
- accept_hist[k]: number of verifications that accepted exactly k draft tokens.
- *_tokens_per_s: tokens summed over prompts / seconds summed over prompts; speedup and
  pld_speedup are spec (or prompt-lookup) tokens/s over plain tokens/s. In bf16 the methods may emit
  answers of different lengths, so a ratio of total times would mislead.
- identical_to_ar: prompts (all turns) whose output equals plain decoding token for token.
- skipped_prompts: questions not run because first turn + max_new_tokens exceeds the target's context;
  dropped_turns: later turns not run for the same reason (the earlier turns count).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path


@dataclass
class PromptResult:
    question_id: int | str
    domain: str
    category: str
    turns: int
    ar_tokens: int = 0
    ar_time: float = 0.0
    spec_tokens: int = 0
    spec_time: float = 0.0
    pld_tokens: int = 0
    pld_time: float = 0.0
    pld_forwards: int = 0  # prefills included
    accepted: list[int] = field(default_factory=list)  # draft tokens accepted per verification
    identical: bool | None = None  # None when sampling (no token-for-token reference)
    timings: dict[str, float] = field(default_factory=dict)  # engine seconds per phase
    dropped_turns: int = 0  # later turns beyond the target's context, not run


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 4) if b > 0 else None


def summarize(results: list[PromptResult], depth: int) -> dict:
    acc = [a for r in results for a in r.accepted]
    steps = len(acc)
    alpha = []
    for d in range(1, depth + 1):
        reached = sum(a >= d - 1 for a in acc)
        alpha.append(_ratio(sum(a >= d for a in acc), reached))
    ar_tok, ar_t = sum(r.ar_tokens for r in results), sum(r.ar_time for r in results)
    sp_tok, sp_t = sum(r.spec_tokens for r in results), sum(r.spec_time for r in results)
    pl_tok, pl_t = sum(r.pld_tokens for r in results), sum(r.pld_time for r in results)
    turns = sum(r.turns for r in results)
    pl_fwd = sum(r.pld_forwards for r in results)
    ar_tps, sp_tps, pl_tps = _ratio(ar_tok, ar_t), _ratio(sp_tok, sp_t), _ratio(pl_tok, pl_t)
    phases: dict[str, float] = {}
    for r in results:
        for k, v in r.timings.items():
            phases[k] = phases.get(k, 0.0) + v
    checked = [r.identical for r in results if r.identical is not None]
    return {
        "n_prompts": len(results),
        "tau": round(1 + sum(acc) / steps, 4) if steps else None,
        "alpha": alpha,
        "accept_hist": [sum(a == k for a in acc) for k in range(depth + 1)],
        "verifications": steps,
        "ar_tokens_per_s": ar_tps,
        "spec_tokens_per_s": sp_tps,
        "pld_tokens_per_s": pl_tps,
        "speedup": _ratio(sp_tps or 0, ar_tps or 0),
        "pld_speedup": _ratio(pl_tps or 0, ar_tps or 0),
        "pld_tau": _ratio(pl_tok - turns, pl_fwd - turns),  # prefills excluded, as for tau
        "identical_to_ar": sum(checked) if checked else None,
        "tokens": {"ar": ar_tok, "spec": sp_tok, "pld": pl_tok},
        # Engine time per verification step by phase (draft; verify = the target's decoder; accept =
        # its lm_head at tree nodes + the rule; compact; observe; bookkeeping); prefill per turn.
        "ms_per_step": {k: round(1000 * v / steps, 3) for k, v in sorted(phases.items()) if k != "prefill"}
        if steps
        else {},
        "prefill_ms_per_turn": round(1000 * phases.get("prefill", 0.0) / turns, 3) if turns else None,
        "dropped_turns": sum(r.dropped_turns for r in results),
    }


def build_report(
    results: list[PromptResult], depth: int, meta: dict, skipped: dict[str, int] | None = None
) -> dict:
    """`skipped`: per domain, the questions not run (too long for the target's context)."""
    skipped = skipped or {}
    domains = {}
    for r in results:
        domains.setdefault(r.domain, []).append(r)
    for d in skipped:
        domains.setdefault(d, [])
    summaries = {d: {**summarize(rs, depth), "skipped_prompts": skipped.get(d, 0)} for d, rs in domains.items()}
    return {
        **meta,
        "overall": {**summarize(results, depth), "skipped_prompts": sum(skipped.values())},
        "domains": summaries,
        "prompts": [asdict(r) for r in results],
    }


def skipped_line(report: dict) -> str:
    """Questions and later turns left out for the target's context, per domain ("" when none)."""
    parts = []
    for name, s in report["domains"].items():
        n, t = s.get("skipped_prompts", 0), s.get("dropped_turns", 0)
        if n or t:
            parts.append(f"{name}: {n} prompts" + (f", {t} later turns" if t else ""))
    if not parts:
        return ""
    return "- skipped (prompt + max_new_tokens beyond the target's context): " + "; ".join(parts)


def _fmt(x, spec="{:.2f}") -> str:
    return "-" if x is None else spec.format(x)


def table(report: dict) -> str:
    """The per-domain table as Markdown."""
    depth = len(report["overall"]["alpha"])
    head = ["domain", "n", "tau"] + [f"a{d}" for d in range(1, depth + 1)]
    head += ["plain tok/s", "spec tok/s", "speedup", "PLD speedup", "PLD tau", "identical"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    rows = list(report["domains"].items()) + [("**overall**", report["overall"])]
    for name, s in rows:
        cells = [name, str(s["n_prompts"]), _fmt(s["tau"])] + [_fmt(a) for a in s["alpha"]]
        cells += [_fmt(s["ar_tokens_per_s"], "{:.1f}"), _fmt(s["spec_tokens_per_s"], "{:.1f}")]
        cells += [_fmt(s["speedup"], "{:.2f}x"), _fmt(s["pld_speedup"], "{:.2f}x"), _fmt(s["pld_tau"])]
        ident = s["identical_to_ar"]
        cells.append("-" if ident is None else f"{ident}/{s['n_prompts']}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def markdown(report: dict) -> str:
    curve = report.get("verify_cost") or {}
    base = curve.get("1") or curve.get(1)
    cost_line = ", ".join(f"{k}: {v / base:.2f}x" for k, v in curve.items()) if base else "not measured"
    o = report["overall"]
    out = [
        f"# Speculative decoding report: {report.get('method', '?')}",
        "",
        f"- target: {report.get('target')}, device {report.get('device')}, dtype {report.get('dtype')}",
        f"- tree: {json.dumps({k: v for k, v in report.get('tree', {}).items() if k != 'paths'})}, "
        f"budget {report.get('budget')} ({report.get('budget_source')})",
        f"- acceptance: {report.get('acceptance')}"
        + (
            " (typical acceptance is NOT lossless)"
            if report.get("acceptance") == "typical"
            else " (lossless)"
        ),
        f"- sampling: {json.dumps(report.get('sampling'))}, max_new_tokens {report.get('max_new_tokens')}",
        f"- verify cost (forward over k new tokens / one token): {cost_line}",
        f"- engine time per verification step (ms): {json.dumps(o.get('ms_per_step'))}",
        *([skipped_line(report)] if skipped_line(report) else []),
        "",
        table(report),
        "",
        "tau: tokens per verification incl. the bonus token; a_d: acceptance at draft depth d given depth d-1 accepted;"
        " speedup: spec tokens/s over plain tokens/s (tokens and times summed over prompts); PLD: HF prompt lookup.",
    ]
    return "\n".join(out) + "\n"


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(report["domains"]) + ["overall"]
    stats = [report["domains"][n] for n in names[:-1]] + [report["overall"]]
    fig, ax = plt.subplots(1, 3, figsize=(16, 4.5))
    x = range(len(names))
    ax[0].bar([i - 0.2 for i in x], [s["speedup"] or 0 for s in stats], 0.4, label="speculative")
    ax[0].bar([i + 0.2 for i in x], [s["pld_speedup"] or 0 for s in stats], 0.4, label="prompt lookup")
    ax[0].axhline(1.0, color="gray", lw=0.8)
    ax[0].set_xticks(list(x), names, rotation=30, ha="right")
    ax[0].set_ylabel("speedup over plain decoding")
    ax[0].legend()
    for n, s in zip(names, stats, strict=True):
        ax[1].plot(
            range(1, len(s["alpha"]) + 1),
            [a if a is not None else float("nan") for a in s["alpha"]],
            marker="o",
            label=n,
        )
    ax[1].set_xticks(range(1, len(report["overall"]["alpha"]) + 1))
    ax[1].set_xlabel("draft depth")
    ax[1].set_ylabel("acceptance rate given previous accepted")
    ax[1].set_ylim(0, 1)
    ax[1].legend(fontsize=7)
    curve = report.get("verify_cost") or {}
    if curve:
        ks = [int(k) for k in curve]
        base = list(curve.values())[0]
        ax[2].plot(ks, [v / base for v in curve.values()], marker="o")
        ax[2].set_xscale("log", base=2)
        ax[2].set_xlabel("new tokens per forward")
        ax[2].set_ylabel("cost / one-token forward")
        if report.get("budget"):
            ax[2].axvline(
                report["budget"] + 1, color="red", lw=0.8, label=f"budget {report['budget']} + root"
            )
            ax[2].legend()
    ax[2].set_title("verify cost curve")
    fig.suptitle(
        f"{report.get('method', '')} on {report.get('target', '')} ({report.get('device')}, {report.get('dtype')})"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(report: dict, out_dir: str | Path) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    (out / "report.md").write_text(markdown(report))
    plot(report, out / "report.png")
    return out
