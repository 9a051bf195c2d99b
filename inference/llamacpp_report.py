"""The llama.cpp evaluation as a headway report: the standard rows plus every configuration and the ceiling.

    report = llamacpp_report(records, configs, meta, curve, primary="f16", n_max=1)
    write_report(report, out); (out / "report.md").write_text(markdown(report) + llamacpp_markdown(report))

The standard rows (inference/report.py, unchanged): plain = llama.cpp plain with the drafter's target
GGUF, spec = llama.cpp with the headway drafter, PLD = llama.cpp's fastest n-gram speculation. Their
accepted-length histogram comes from llama-server's per-position counters: a step that accepted k draft
tokens counted at positions 0..k-1, so the counts give exactly how many steps accepted k; steps that
carried no draft accepted none. Target forwards after a turn's prefill: its tokens - 1 - accepted.
Times are llama.cpp's own decode times (`predicted_ms`: what its tokens/s figures quote), in the standard
rows too: the prefill is the same target forward in every configuration, and over short answers to long
prompts (summarisation, RAG) it would swamp the decoding speed. End-to-end tokens/s (prompt + decode
time; the drafter's own pass over the prompt shows there) is reported beside it.
`report["llamacpp"]` adds, per configuration, per domain and overall: decode tokens/s, end-to-end
tokens/s, tau, acceptance, speedups over plain with the same target GGUF and over the fastest plain
configuration, identical answers to plain with the same target and where the others first differ;
and the ceiling (inference/llamacpp_ceiling.py).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict

from headway.inference.llamacpp_ceiling import ceiling, reached
from headway.inference.llamacpp_eval import LlamaConfig, TurnRecord
from headway.inference.report import PLAIN, MethodRun, PromptResult, build_report


def forwards(r: TurnRecord) -> int:
    """Target forwards after the turn's prefill: each emits one token plus the drafts it accepted."""
    return max(r.draft_steps, len(r.tokens) - 1 - r.accepted)


def accepted_per_step(r: TurnRecord) -> list[int]:
    """Accepted draft tokens per verification step (in no particular order), from the per-position counts."""
    pos = list(r.per_position)
    if sum(pos) != r.accepted:
        raise ValueError(
            f"{r.config}: {r.accepted} accepted but {sum(pos)} counted per position (drafts longer than n-max)"
        )
    exactly = [r.draft_steps - (pos[0] if pos else 0)] + [
        a - b for a, b in zip(pos, [*pos[1:], 0], strict=True)
    ]
    steps = [0] * (forwards(r) - r.draft_steps)
    for k, n in enumerate(exactly):
        steps += [k] * n
    return steps


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 4) if b else None


def _by_question(records: list[TurnRecord]) -> dict:
    out: dict = defaultdict(list)
    for r in records:
        out[r.question_id].append(r)
    return out


def divergences(records: list[TurnRecord], reference: list[TurnRecord]) -> tuple[int, list[dict]]:
    """(questions compared, the ones whose answers differ from the reference: question, turn, first token index)."""
    ref = {(r.question_id, r.turn): r.tokens for r in reference}
    compared, differ = 0, []
    for qid, turns in _by_question(records).items():
        compared += 1
        for r in sorted(turns, key=lambda r: r.turn):
            want = ref.get((qid, r.turn))
            if want is not None and r.tokens != want:
                at = next(
                    (i for i, (a, b) in enumerate(zip(r.tokens, want, strict=False)) if a != b),
                    min(len(r.tokens), len(want)),
                )
                differ.append({"question_id": qid, "domain": r.domain, "turn": r.turn, "index": at})
                break
    return compared, differ


def summarize_config(records: list[TurnRecord], reference: list[TurnRecord] | None) -> dict:
    tokens = sum(len(r.tokens) for r in records)
    seconds = sum(r.prompt_ms + r.predicted_ms for r in records) / 1000
    fwd, acc = sum(forwards(r) for r in records), sum(r.accepted for r in records)
    steps, pos = (
        sum(r.draft_steps for r in records),
        [0] * max((len(r.per_position) for r in records), default=0),
    )
    for r in records:
        for i, n in enumerate(r.per_position):
            pos[i] += n
    alpha = [_ratio(p, prev) for p, prev in zip(pos, [steps, *pos][: len(pos)], strict=True)]
    out = {
        "turns": len(records),
        "tokens": tokens,
        "tokens_per_s": _ratio(tokens, sum(r.predicted_ms for r in records) / 1000),
        "end_to_end_tokens_per_s": _ratio(tokens, seconds),
        "tau": round(1 + acc / fwd, 4) if fwd else None,
        "forwards": fwd,
        "drafted": sum(r.drafted for r in records),
        "accepted": acc,
        "acceptance": _ratio(acc, sum(r.drafted for r in records)),
        "draft_steps": steps,
        "alpha": alpha,
    }
    if reference is not None:
        compared, differ = divergences(records, reference)
        out.update(identical=compared - len(differ), compared=compared, divergences=differ)
    return out


def _summaries(records, configs, reference_of) -> dict:
    by_cfg: dict = defaultdict(list)
    for r in records:
        by_cfg[r.config].append(r)
    out = {}
    for c in configs:
        rs, ref = by_cfg[c.name], by_cfg.get(reference_of.get(c.name, ""), None)
        domains: dict = defaultdict(list)
        for r in rs:
            domains[r.domain].append(r)
        out[c.name] = {
            "config": asdict(c),
            "overall": summarize_config(rs, ref),
            "domains": {
                d: summarize_config(v, [x for x in ref if x.domain == d] if ref else None)
                for d, v in domains.items()
            },
        }
    return out


def _add_speedups(summaries: dict, configs: list[LlamaConfig], fastest: str) -> None:
    for c in configs:
        s, plain, best = summaries[c.name], summaries[f"plain-{c.target}"], summaries[fastest]
        for scope in ("overall", *s["domains"]):
            mine = s["overall"] if scope == "overall" else s["domains"][scope]
            same = plain["overall"] if scope == "overall" else plain["domains"].get(scope, {})
            top = best["overall"] if scope == "overall" else best["domains"].get(scope, {})
            mine["speedup"] = _ratio(mine["tokens_per_s"] or 0, same.get("tokens_per_s") or 0)
            mine["speedup_vs_fastest_plain"] = _ratio(mine["tokens_per_s"] or 0, top.get("tokens_per_s") or 0)


def _prompt_results(records, plain: str, spec: str, ngram: str | None) -> list[PromptResult]:
    """Per question, report rows: plain decoding (PLAIN), the EAGLE-3 configuration and the n-gram one."""
    out = []
    for qid, rs in _by_question(records).items():
        first = rs[0]
        turns = 1 + max(r.turn for r in rs)
        res = PromptResult(qid, first.domain, first.domain, turns)
        mine = {
            name: sorted((r for r in rs if r.config == name), key=lambda r: r.turn)
            for name in (plain, spec, ngram)
            if name is not None
        }
        for row, name in ((PLAIN, plain), (spec, spec), (ngram, ngram)):
            ts = mine.get(name) or []
            if not ts:
                continue
            run = res.runs[row] = MethodRun()
            for r in ts:
                run.add(len(r.tokens), r.predicted_ms / 1000)
            run.forwards = sum(forwards(r) + 1 for r in ts)  # prefills included
            if row != PLAIN:
                run.identical = [r.tokens for r in ts] == [r.tokens for r in mine[plain]]
        if spec in res.runs:
            res.runs[spec].accepted = [a for r in mine[spec] for a in accepted_per_step(r)]
        out.append(res)
    return out


def llamacpp_report(
    records: list[TurnRecord],
    configs: list[LlamaConfig],
    meta: dict,
    curve: dict[int, float],
    primary: str,
    n_max: int,
) -> dict:
    """The report dict (inference/report.py's format) with `llamacpp` (every configuration) and the ceiling."""
    names = {c.name for c in configs}
    plain, spec = f"plain-{primary}", f"eagle3-{primary}"
    if plain not in names or spec not in names:
        raise ValueError(f"the report needs configurations {plain} and {spec}")
    reference_of = {c.name: f"plain-{c.target}" for c in configs if c.kind != "plain"}
    summaries = _summaries(records, configs, reference_of)
    plains = [c.name for c in configs if c.kind == "plain"]
    fastest = max(plains, key=lambda n: summaries[n]["overall"]["tokens_per_s"] or 0)
    ngrams = [c.name for c in configs if c.kind == "ngram" and c.target == primary]
    best_ngram = max(ngrams, key=lambda n: summaries[n]["overall"]["tokens_per_s"] or 0) if ngrams else None
    _add_speedups(summaries, configs, fastest)
    results = _prompt_results(records, plain, spec, best_ngram)
    report = build_report(
        results,
        n_max,
        {**meta, "verify_cost": {str(k): v for k, v in curve.items()}},
        headline=spec,
        pld=best_ngram,
    )
    drafter = summaries[spec]["overall"]
    steps = (drafter["forwards"], drafter["draft_steps"], drafter["drafted"])
    alpha = [a or 0.0 for a in drafter["alpha"]]
    bound = ceiling(curve, alpha, n_max, drafter["tau"], steps) if curve and drafter["forwards"] else None
    report["llamacpp"] = {
        "configs": summaries,
        "primary_target": primary,
        "fastest_plain": fastest,
        "best_ngram": best_ngram,
        "ceiling": bound,
        "reached_of_ceiling": reached(drafter.get("speedup"), (bound or {}).get("measured")),
    }
    return report


def _f(x, spec="{:.2f}") -> str:
    return "-" if x is None else spec.format(x)


def llamacpp_markdown(report: dict) -> str:
    """The llama.cpp section of report.md: every configuration, speedups per domain, the ceiling, divergences."""
    ll = report["llamacpp"]
    cfgs = ll["configs"]
    lines = [
        "",
        "## llama.cpp configurations",
        "",
        f"In the table above plain is llama.cpp plain with target GGUF {ll['primary_target']}, spec the headway "
        f"drafter, PLD llama.cpp's fastest n-gram type ({ll['best_ngram']}), not HF prompt lookup. "
        f"Same prompts, back to back, order rotated per prompt; greedy; fastest plain: {ll['fastest_plain']}; "
        f"best n-gram: {ll['best_ngram']}. tok/s: tokens over llama.cpp's decode time; end-to-end: over prompt "
        "+ decode time; speedup: of tok/s over plain with the same target GGUF; vs fastest: over the fastest "
        "plain configuration; identical: answers equal to plain with the same target GGUF.",
        "",
        "| configuration | target | tok/s | end-to-end tok/s | tau | accepted / drafted | speedup | vs fastest plain | identical |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, c in cfgs.items():
        o = c["overall"]
        ident = f"{o['identical']}/{o['compared']}" if "identical" in o else "-"
        lines.append(
            f"| {name} | {c['config']['target']} | {_f(o['tokens_per_s'], '{:.1f}')} | {_f(o['end_to_end_tokens_per_s'], '{:.1f}')} "
            f"| {_f(o['tau'])} | {o['accepted']} / {o['drafted']} | {_f(o.get('speedup'), '{:.2f}x')} "
            f"| {_f(o.get('speedup_vs_fastest_plain'), '{:.2f}x')} | {ident} |"
        )
    domains = list(report["domains"])
    lines += ["", "Speedup over plain with the same target GGUF, per domain:", ""]
    lines += ["| configuration | " + " | ".join(domains) + " |", "|---|" + "---|" * len(domains)]
    for name, c in cfgs.items():
        cells = [_f(c["domains"].get(d, {}).get("speedup"), "{:.2f}x") for d in domains]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    bound = ll.get("ceiling")
    if bound:
        rel = ", ".join(f"{k}: {v:.2f}x" for k, v in bound["verify_cost_relative"].items())
        chains = "; ".join(
            f"n={r['n']}: tau {r['tau']:.2f} / cost {r['cost']:.2f} = {r['speedup']:.2f}x"
            for r in bound["per_chain"]
        )
        lines += [
            "",
            "## Ceiling",
            "",
            f"- verify cost (forward over k new tokens at depth 256 / one token, llama-bench): {rel}",
            f"- drafter's acceptance per depth (given the previous accepted): "
            f"{cfgs['eagle3-' + ll['primary_target']]['overall']['alpha']}",
            f"- ceiling per chain length from that acceptance, drafting free: {chains}",
            f"- a one-token chain pays only with acceptance above {bound['alpha1_needed']:.2f}",
        ]
        if "measured" in bound:
            m = bound["measured"]
            lines.append(
                f"- ceiling at the measured tau {m['tau']:.2f} with up to {bound['n_max']} draft token(s) per step "
                f"(mean verify cost {m['cost']:.2f} one-token forwards over the steps as drafted): "
                f"{m['speedup']:.2f}x; reached: {_f(ll['reached_of_ceiling'], '{:.0%}')}"
            )
    differ = [(n, d) for n, c in cfgs.items() for d in c["overall"].get("divergences", [])]
    if differ:
        lines += ["", "## Answers that differ from plain with the same target", ""]
        lines += [
            f"- {n}: question {d['question_id']} ({d['domain']}), turn {d['turn'] + 1}, from token {d['index']}"
            for n, d in differ
        ]
    return "\n".join(lines) + "\n"
