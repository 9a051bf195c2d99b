"""Per-domain evaluation report: every method measured in the same run, row by row, against plain decoding.

A method is anything that answered the prompts: plain decoding (the baseline, `PLAIN`), the engine
in each drafting mode (the trained drafter alone, prompt lookup alone, both fused), HF prompt
lookup, or rows another tool adds (`PromptResult.runs[name]`, any name). Definitions (what
`report.json` holds per domain and `overall`, under `methods[name]`):
- tau: mean tokens emitted per target forward, the bonus token included. Engine methods: 1 + mean
  accepted draft tokens per verification; methods that only count forwards (HF prompt lookup):
  (tokens - turns) / (forwards - turns), prefills excluded either way.
- alpha[d-1] (engine methods): P(the depth-d draft token is accepted | depth d-1 was), over verifications.
- accept_hist[k]: number of verifications that accepted exactly k draft tokens.
- tokens_per_s: tokens summed over prompts / seconds summed over prompts; speedup: that over plain's.
  In bf16 the methods may emit answers of different lengths, so a ratio of total times would mislead.
- identical_to_plain: prompts (all turns) whose output equals plain decoding token for token.
- ms_per_step: engine time per verification step by phase (draft; verify = the target's decoder;
  accept = its lm_head at tree nodes + the rule; compact; observe; bookkeeping).
- skipped_prompts: questions not run because first turn + max_new_tokens exceeds the target's context;
  dropped_turns: later turns not run for the same reason (the earlier turns count).
The per-domain top level also keeps the headline method's numbers under the earlier key names
(tau, alpha, speedup, spec_tokens_per_s, pld_speedup, identical_to_ar, ...), which model cards read.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

PLAIN = "plain"
PHASES = ("draft", "verify", "accept", "compact", "observe", "bookkeeping")


@dataclass
class MethodRun:
    """One method's answers to one prompt (all its turns)."""

    tokens: int = 0
    time: float = 0.0
    accepted: list[int] | None = None  # engine: draft tokens accepted per verification
    forwards: int = 0  # target forwards, prefills included (methods that do not report acceptance)
    identical: bool | None = None  # equal to plain's output, every turn (None: sampling, or plain itself)
    timings: dict[str, float] = field(default_factory=dict)  # engine seconds per phase

    def add(self, tokens: int, seconds: float) -> None:
        self.tokens += tokens
        self.time += seconds


@dataclass
class PromptResult:
    question_id: int | str
    domain: str
    category: str
    turns: int
    runs: dict[str, MethodRun] = field(default_factory=dict)
    dropped_turns: int = 0  # later turns beyond the target's context, not run


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 4) if b > 0 else None


def summarize_method(results: list[PromptResult], name: str, depth: int, plain_tps: float | None) -> dict | None:
    """One method's numbers over these prompts (None: it answered none of them)."""
    runs = [r.runs[name] for r in results if name in r.runs]
    if not runs:
        return None
    tok, t = sum(x.tokens for x in runs), sum(x.time for x in runs)
    tps = _ratio(tok, t)
    speedup = _ratio(tps, plain_tps or 0) if tps is not None else None
    out: dict = {"n_prompts": len(runs), "tokens": tok, "tokens_per_s": tps, "speedup": speedup}
    checked = [x.identical for x in runs if x.identical is not None]
    out["identical_to_plain"] = sum(checked) if checked else None
    if any(x.accepted is not None for x in runs):
        acc = [a for x in runs for a in x.accepted or []]
        steps = len(acc)
        out["tau"] = round(1 + sum(acc) / steps, 4) if steps else None
        out["alpha"] = [
            _ratio(sum(a >= d for a in acc), sum(a >= d - 1 for a in acc)) for d in range(1, depth + 1)
        ]
        out["accept_hist"] = [sum(a == k for a in acc) for k in range(depth + 1)]
        out["verifications"] = steps
        phases: dict[str, float] = {}
        for x in runs:
            for k, v in x.timings.items():
                phases[k] = phases.get(k, 0.0) + v
        turns = sum(r.turns for r in results if name in r.runs)
        out["ms_per_step"] = (
            {k: round(1000 * v / steps, 3) for k, v in sorted(phases.items()) if k != "prefill"} if steps else {}
        )
        out["prefill_ms_per_turn"] = round(1000 * phases.get("prefill", 0.0) / turns, 3) if turns else None
    elif name != PLAIN:
        turns = sum(r.turns for r in results if name in r.runs)
        out["tau"] = _ratio(tok - turns, sum(x.forwards for x in runs) - turns)
    return out


def summarize(results: list[PromptResult], depth: int, methods: list[str], headline: str, pld: str | None = None) -> dict:
    plain = summarize_method(results, PLAIN, depth, None) or {"tokens_per_s": None}
    per = {PLAIN: plain} | {m: summarize_method(results, m, depth, plain["tokens_per_s"]) for m in methods if m != PLAIN}
    per = {m: v for m, v in per.items() if v is not None}
    head, pl = per.get(headline, {}), per.get(pld, {}) if pld else {}
    return {
        "n_prompts": len(results),
        "methods": per,
        # the headline method under the earlier flat keys
        "tau": head.get("tau"),
        "alpha": head.get("alpha", [None] * depth),
        "accept_hist": head.get("accept_hist", [0] * (depth + 1)),
        "verifications": head.get("verifications", 0),
        "ar_tokens_per_s": plain["tokens_per_s"],
        "spec_tokens_per_s": head.get("tokens_per_s"),
        "pld_tokens_per_s": pl.get("tokens_per_s"),
        "speedup": head.get("speedup"),
        "pld_speedup": pl.get("speedup"),
        "pld_tau": pl.get("tau"),
        "identical_to_ar": head.get("identical_to_plain"),
        "ms_per_step": head.get("ms_per_step", {}),
        "prefill_ms_per_turn": head.get("prefill_ms_per_turn"),
        "dropped_turns": sum(r.dropped_turns for r in results),
    }


def build_report(
    results: list[PromptResult],
    depth: int,
    meta: dict,
    skipped: dict[str, int] | None = None,
    headline: str | None = None,
    pld: str | None = None,
) -> dict:
    """`skipped`: per domain, the questions not run (too long for the target's context). `headline`:
    the method the flat keys describe (default: the first non-plain method); `pld`: HF prompt lookup's name."""
    skipped = skipped or {}
    methods = list(dict.fromkeys(m for r in results for m in r.runs))
    methods = [PLAIN] + [m for m in methods if m != PLAIN]
    headline = headline or next((m for m in methods if m not in (PLAIN, pld)), PLAIN)
    domains = {}
    for r in results:
        domains.setdefault(r.domain, []).append(r)
    for d in skipped:
        domains.setdefault(d, [])
    summaries = {
        d: {**summarize(rs, depth, methods, headline, pld), "skipped_prompts": skipped.get(d, 0)}
        for d, rs in domains.items()
    }
    return {
        **meta,
        "methods": methods,
        "headline": headline,
        "overall": {**summarize(results, depth, methods, headline, pld), "skipped_prompts": sum(skipped.values())},
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
    """Per domain, one row per method, as Markdown."""
    depth = len(report["overall"]["alpha"])
    head = ["domain", "method", "n", "tau"] + [f"a{d}" for d in range(1, depth + 1)]
    head += ["tok/s", "speedup", "identical"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    rows = list(report["domains"].items()) + [("**overall**", report["overall"])]
    for name, s in rows:
        for method, m in s.get("methods", {}).items():
            alpha = m.get("alpha") or [None] * depth
            cells = [name, method, str(m.get("n_prompts", 0)), _fmt(m.get("tau") if method != PLAIN else 1.0)]
            cells += [_fmt(a) for a in alpha]
            cells += [_fmt(m["tokens_per_s"], "{:.1f}"), _fmt(m["speedup"], "{:.2f}x")]
            ident = m.get("identical_to_plain")
            cells.append("-" if ident is None else f"{ident}/{m.get('n_prompts', 0)}")
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def phase_table(report: dict) -> str:
    """Engine ms per verification step by phase, per engine method (overall), and drafting +
    acceptance as a share of the verify forward; "" when no method recorded phase timings (llama.cpp)."""
    head = ["method", *PHASES, "step", "(draft + accept) / verify"]
    lines = []
    for method, m in report["overall"].get("methods", {}).items():
        ms = m.get("ms_per_step")
        if not ms:
            continue
        share = _ratio(ms.get("draft", 0.0) + ms.get("accept", 0.0), ms.get("verify", 0.0))
        cells = [method] + [_fmt(ms.get(p), "{:.1f}") for p in PHASES]
        cells += [_fmt(sum(ms.values()), "{:.1f}"), _fmt(share, "{:.0%}")]
        lines.append("| " + " | ".join(cells) + " |")
    if not lines:
        return ""
    return "\n".join(["| " + " | ".join(head) + " |", "|" + "---|" * len(head), *lines])


def markdown(report: dict) -> str:
    curve = report.get("verify_cost") or {}
    base = curve.get("1") or curve.get(1)
    cost_line = ", ".join(f"{k}: {v / base:.2f}x" for k, v in curve.items()) if base else "not measured"
    out = [
        f"# Speculative decoding report: {report.get('method', '?')}",
        "",
        f"- target: {report.get('target')}, device {report.get('device')}, dtype {report.get('dtype')}"
        + (f" ({report['hardware']})" if report.get("hardware") else ""),
        f"- tree: {json.dumps({k: v for k, v in report.get('tree', {}).items() if k != 'paths'})}, "
        f"budget {report.get('budget')} ({report.get('budget_source')})",
        f"- accuracy profile: {report.get('accuracies', 'not recorded')}",
        f"- acceptance: {report.get('acceptance')}"
        + (
            " (typical acceptance is NOT lossless)"
            if report.get("acceptance") == "typical"
            else " (lossless)"
        ),
        f"- sampling: {json.dumps(report.get('sampling'))}, max_new_tokens {report.get('max_new_tokens')}",
        f"- verify cost (forward over k new tokens / one token): {cost_line}",
        *([f"- engines: {json.dumps(report['engines'])}"] if report.get("engines") else []),
        *([skipped_line(report)] if skipped_line(report) else []),
        "",
        table(report),
        "",
        "tau: tokens per target forward incl. the bonus token; a_d: acceptance at draft depth d given depth d-1 accepted;"
        " speedup: tokens/s over plain tokens/s (tokens and times summed over prompts); methods ran interleaved per prompt.",
        *(["", "Engine time per verification step (ms):", "", phases] if (phases := phase_table(report)) else []),
    ]
    return "\n".join(out) + "\n"


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(report["domains"]) + ["overall"]
    stats = [report["domains"][n] for n in names[:-1]] + [report["overall"]]
    methods = [m for m in report.get("methods", []) if m != PLAIN]
    fig, ax = plt.subplots(1, 3, figsize=(16, 4.5))
    x = range(len(names))
    width = 0.8 / max(1, len(methods))
    for j, m in enumerate(methods):
        ax[0].bar(
            [i - 0.4 + width * (j + 0.5) for i in x],
            [s["methods"].get(m, {}).get("speedup") or 0 for s in stats],
            width,
            label=m,
        )
    ax[0].axhline(1.0, color="gray", lw=0.8)
    ax[0].set_xticks(list(x), names, rotation=30, ha="right")
    ax[0].set_ylabel("speedup over plain decoding")
    ax[0].legend(fontsize=7)
    for n, s in zip(names, stats, strict=True):
        ax[1].plot(
            range(1, len(s["alpha"]) + 1),
            [a if a is not None else float("nan") for a in s["alpha"]],
            marker="o",
            label=n,
        )
    ax[1].set_xticks(range(1, len(report["overall"]["alpha"]) + 1))
    ax[1].set_xlabel(f"draft depth ({report.get('headline', '')})")
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
