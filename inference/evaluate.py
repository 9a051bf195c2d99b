"""Per-domain report: plain decoding vs the engine's drafting modes vs HF prompt lookup, prompt by prompt.

    python scripts/evaluate.py --config configs/smollm2-135m/medusa.yaml --checkpoint runs/smollm2-135m/medusa
    python scripts/evaluate.py --config configs/smollm2-135m/eagle3.yaml --checkpoint DIR --per-domain 10 \\
        --max-new-tokens 128 --out runs/eval/eagle3
    python scripts/evaluate.py --config configs/smollm2-135m/medusa.yaml --per-domain 2 --max-new-tokens 32  # smoke: untrained heads
    python scripts/evaluate.py --config configs/smollm2-135m/medusa.yaml --layer-skip 8   # self-speculation baseline
    python scripts/evaluate.py --config configs/smollm2-135m/eagle3.yaml --checkpoint DIR --modes fused
    python scripts/evaluate.py --config ... target.dtype=float32 --costs-from runs/eval/eagle3/report.json  # same text

Methods: plain decoding (transformers generate), the engine in each drafting mode of `--modes`
(default: the trained drafter alone, our prompt lookup alone, both fused into one tree; lookup only
when the recipe has no heads), and HF prompt lookup. The recipe's `inference.drafter` mode is the
headline (the report's flat keys and title). Questions default to Spec-Bench (six domains);
`--questions FILE` takes any JSONL in its format. For every prompt (and every turn of a multi-turn
one, each method continuing its own answers) the methods run back to back in one process, in an
order that rotates per prompt, so machine drift hits all alike. Writes report.json / report.md /
report.png to --out and prints the tables. Extra `section.key=value` arguments override the recipe
(e.g. inference.tree_budget=32).

An auto budget is chosen from the verify-cost curve, the drafter's draft cost and its accuracy profile
fitted to what it accepts on a few generic prompts (`inference/calibration.py`), all measured at start-up.
`--costs-from REPORT` sizes trees from an earlier report's curve, draft cost and fitted scale instead of
measuring them. Two variants of the engine compared in fp32 then write the same text (every answer
equals plain) with the trees a bf16 run would build: in bf16 their answers part at near-ties, so
their tau would compare different texts; without it fp32's steeper curve would pick smaller trees.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from headway.bench import hardware, timed
from headway.cli import run_main
from headway.config import load_config
from headway.data.chat import first_turn_ids, next_turn_ids
from headway.inference.build import MODES, EngineSetup, build_engines, retune_budget
from headway.inference.calibration import calibrate
from headway.inference.cost import measure_verify_cost
from headway.inference.questions import load_questions, skip_long_questions
from headway.inference.report import (
    PLAIN,
    MethodRun,
    PromptResult,
    build_report,
    phase_table,
    table,
    write_report,
)
from headway.paths import resolve_path
from headway.target import context_length, load_target
from headway.tokens import cut_at_eos

PLD = "hf-prompt-lookup"  # transformers' own prompt lookup decoding, the external baseline


class ForwardCounter:
    """Counts the target's top-level forwards (prefill included) during HF generate."""

    def __init__(self, model):
        self.n = 0
        self.handle = model.register_forward_pre_hook(self._hook)

    def _hook(self, *_):
        self.n += 1


def turn_ids(tok, messages: list[dict], prev_ids: list[int] | None, ended: bool) -> list[int]:
    """Prompt ids for the conversation `messages` (ending with a user turn), answers kept verbatim."""
    if prev_ids is None:
        return first_turn_ids(tok, messages[-1]["content"])
    ids = next_turn_ids(tok, messages, prev_ids, ended)
    if ids is None:  # the template rewrites answers: render the whole conversation instead
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids = tok(text, add_special_tokens=False)["input_ids"]
    return ids


class Runner:
    """Answers each question with every method back to back, each continuing its own conversation."""

    def __init__(self, setups: dict[str, EngineSetup], tok, cfg, eos: list[int], context: int):
        first = next(iter(setups.values()))
        self.model = first.target  # every engine verifies with the same target (Medusa-2: the adapted one)
        self.engines = {s.method: s.engine for s in setups.values()}
        self.methods = [PLAIN, *self.engines, PLD]
        self.tok, self.cfg, self.eos = tok, cfg, eos
        self.context = context  # prompt + answer of every turn must fit the target's positions
        self.device = next(self.model.parameters()).device
        self.counter = ForwardCounter(self.model)
        inf = cfg.inference
        self.gen_kwargs = {"do_sample": False}
        if inf.temperature > 0:
            self.gen_kwargs = {
                "do_sample": True,
                "temperature": inf.temperature,
                "top_p": inf.top_p,
                "top_k": inf.sample_top_k,
            }

    def hf(self, ids: list[int], max_new: int, pld: bool, seed: int):
        x = torch.tensor([ids], device=self.device)
        extra = {"prompt_lookup_num_tokens": self.cfg.eval.pld_num_tokens} if pld else {}
        torch.manual_seed(seed)
        self.counter.n = 0
        with timed(self.device) as m, torch.inference_mode():
            out = self.model.generate(
                x,
                attention_mask=torch.ones_like(x),
                max_new_tokens=max_new,
                eos_token_id=self.eos,
                pad_token_id=self.tok.pad_token_id,
                **self.gen_kwargs,
                **extra,
            )
        # generate pads finished rows with pad (= eos here): cut after the first eos
        return cut_at_eos(out[0, len(ids) :].tolist(), self.eos), m.seconds, self.counter.n

    def spec(self, name: str, ids: list[int], max_new: int, seed: int):
        with timed(self.device) as m:
            out = self.engines[name].generate([ids], max_new, seed=seed)
        return out.tokens[0], m.seconds, out

    def answer(self, method: str, ids: list[int], max_new: int, seed: int, run: MethodRun) -> list[int]:
        """One turn by one method; its measurements go into `run`."""
        if method in self.engines:
            toks, dt, out = self.spec(method, ids, max_new, seed)
            run.accepted += out.accepted[0]
            run.forwards += out.verify_forwards[0] + 1
            for k, v in out.timings.items():
                run.timings[k] = run.timings.get(k, 0.0) + v
        else:
            toks, dt, run_forwards = self.hf(ids, max_new, pld=(method == PLD), seed=seed)
            run.forwards += run_forwards
        run.add(len(toks), dt)
        return toks

    def run_question(self, q, index: int, max_new: int, seed: int) -> PromptResult:
        res = PromptResult(q.question_id, q.domain, q.category, len(q.turns))
        greedy = self.cfg.inference.temperature == 0
        res.runs = {m: MethodRun(accepted=[] if m in self.engines else None) for m in self.methods}
        identical = dict.fromkeys(self.methods[1:], True)
        state = {m: {"messages": [], "ids": None, "ended": False} for m in self.methods}
        k = index % len(self.methods)  # rotate the order per prompt: drift hits every method alike
        order = self.methods[k:] + self.methods[:k]
        for turn, text in enumerate(q.turns):
            prompts = {}
            for m in order:
                st = state[m]
                st["messages"].append({"role": "user", "content": text})
                prompts[m] = turn_ids(self.tok, st["messages"], st["ids"], st["ended"])
            if max(map(len, prompts.values())) + max_new > self.context:
                res.turns, res.dropped_turns = turn, len(q.turns) - turn  # counted in the report, per domain
                break
            outs = {}
            for m in order:
                st, prompt = state[m], prompts[m]
                toks = outs[m] = self.answer(m, prompt, max_new, seed + turn, res.runs[m])
                st["ended"] = bool(toks) and toks[-1] in self.eos
                st["ids"] = prompt + toks
                answer = self.tok.decode(toks[:-1] if st["ended"] else toks, skip_special_tokens=False)
                st["messages"].append({"role": "assistant", "content": answer})
            for m in identical:
                identical[m] &= outs[m] == outs[PLAIN]
        for m, same in identical.items():
            res.runs[m].identical = same if greedy else None
        return res


def read_costs(path: str) -> tuple[dict[int, float], float | None, float | None]:
    """An earlier report's verify-cost curve {new tokens: seconds}, draft cost per step and acceptance
    scale (None: not measured, or not fitted, there). Raises ValueError naming the file and the key
    when the report lacks them."""
    try:
        rep = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ValueError(f"--costs-from {path}: no such file") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"--costs-from {path}: not JSON ({e})") from None
    raw = rep.get("verify_cost") if isinstance(rep, dict) else None
    if not isinstance(raw, dict) or not raw:
        raise ValueError(f"--costs-from {path}: no 'verify_cost' curve (a scripts/evaluate.py report.json has one)")
    try:
        curve = {int(k): float(v) for k, v in raw.items()}
    except (TypeError, ValueError):
        raise ValueError(f"--costs-from {path}: 'verify_cost' must map token counts to seconds, got {raw}") from None
    if min(curve) < 1 or min(curve.values()) <= 0:
        raise ValueError(f"--costs-from {path}: 'verify_cost' needs token counts >= 1 and positive seconds, got {raw}")
    return dict(sorted(curve.items())), _positive(rep, "draft_cost_s", path), _positive(rep, "acceptance_scale", path)


def _positive(rep: dict, key: str, path: str) -> float | None:
    """rep[key] as a finite number > 0, None where absent or null; else a ValueError naming file and key."""
    v = rep.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v <= 0:
        raise ValueError(f"--costs-from {path}: '{key}' must be a positive number, got {v!r}")
    return float(v)


def check_settings(ev, inf, args) -> str | None:
    """Why these evaluation settings cannot run, or None: checked before the target is loaded."""
    if ev.max_new_tokens < 1:
        return f"--max-new-tokens (eval.max_new_tokens) must be at least 1, got {ev.max_new_tokens}"
    if ev.per_domain < 1:
        return f"--per-domain (eval.per_domain) must be at least 1, got {ev.per_domain}"
    if inf.temperature < 0:
        return f"--temperature (inference.temperature) must be >= 0, got {inf.temperature}"
    if args.layer_skip is not None and args.layer_skip < 1:
        return f"--layer-skip must be at least 1, got {args.layer_skip}"
    if args.checkpoint and not Path(args.checkpoint).is_dir():
        return f"--checkpoint {args.checkpoint}: no such folder"
    return None


def modes(cfg, args) -> tuple[str, ...]:
    """The drafting modes to measure: --modes, else every one the recipe allows; the headline always."""
    if args.modes:
        wanted = [m.strip() for m in args.modes.split(",") if m.strip()]
    elif cfg.medusa is not None or cfg.eagle is not None or args.layer_skip:
        wanted = list(MODES)
    else:
        wanted = ["lookup"]
    return tuple(dict.fromkeys([cfg.inference.drafter, *wanted]))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, help="recipe YAML (configs/<model>/<method>.yaml)")
    p.add_argument(
        "--checkpoint", help="trained heads folder (config.json + model.safetensors); omit: untrained heads"
    )
    p.add_argument("--questions", help="Spec-Bench-format JSONL (default: eval.questions)")
    p.add_argument("--per-domain", type=int, help="questions per domain (default: eval.per_domain)")
    p.add_argument("--max-new-tokens", type=int, help="per turn (default: eval.max_new_tokens)")
    p.add_argument("--temperature", type=float, help="0: greedy (default: inference.temperature)")
    p.add_argument("--out", help="output folder (default: eval.output_dir or CHECKPOINT/eval)")
    p.add_argument("--layer-skip", type=int, help="draft with the target's first N layers instead of heads")
    p.add_argument(
        "--modes",
        help=f"comma-separated drafting modes to measure, of {', '.join(MODES)} (default: all; lookup without heads)",
    )
    p.add_argument(
        "--profile", action="store_true", help="synchronise CUDA between engine phases (exact ms per phase)"
    )
    p.add_argument(
        "--costs-from",
        help="an earlier report.json: size trees from its verify-cost curve, draft cost and acceptance scale instead of measuring",
    )
    p.add_argument("overrides", nargs="*", help="section.key=value overrides of the recipe")
    args = p.parse_intermixed_args(argv)

    cfg = load_config(args.config, args.overrides)
    ev, inf = cfg.eval, cfg.inference
    if args.questions:
        ev.questions = args.questions
    if args.per_domain is not None:
        ev.per_domain = args.per_domain
    if args.max_new_tokens is not None:
        ev.max_new_tokens = args.max_new_tokens
    if args.temperature is not None:
        inf.temperature = args.temperature
    problem = check_settings(ev, inf, args)  # before anything heavy is loaded
    if problem:
        p.error(problem)
    costs = read_costs(args.costs_from) if args.costs_from else None
    out_dir = Path(
        args.out or ev.output_dir or (Path(args.checkpoint) / "eval" if args.checkpoint else "runs/eval")
    )
    questions = load_questions(
        resolve_path(ev.questions), ev.per_domain
    )

    target, tok = load_target(cfg.target)
    context = context_length(target)
    questions, too_long = skip_long_questions(
        questions, lambda q: len(first_turn_ids(tok, q.turns[0])), ev.max_new_tokens, context
    )
    limit = f"first turn + max_new_tokens ({ev.max_new_tokens}) beyond the target's context of {context}"
    if too_long:
        print(f"skipped {sum(too_long.values())} questions, {limit}: {dict(too_long)}")
    if not questions:
        raise ValueError(f"every question is too long: {limit}")
    device, dtype = next(target.parameters()).device, next(target.parameters()).dtype
    where = f"from {args.costs_from}" if costs else "measuring it"
    print(f"target {cfg.target.name} on {device} ({dtype}); verify cost curve: {where}")
    curve = costs[0] if costs else measure_verify_cost(target)
    base = curve[min(curve)]
    print("verify cost (k new tokens / one): " + ", ".join(f"{k}: {v / base:.2f}x" for k, v in curve.items()))
    setups = build_engines(cfg, args.checkpoint, target, tok, modes(cfg, args), layer_skip=args.layer_skip, curve=curve)
    headline = setups[inf.drafter]
    eos = sorted(headline.engine.eos_ids)  # build_engine's: the tokenizer's and the generation config's
    for s in setups.values():
        s.engine.profile = args.profile
        print(f"{s.mode}: {s.method}; tree {s.info['tree']['kind']} with {s.info['budget']} nodes ({s.info['budget_source']})")
        for note in s.info["notes"]:
            print("note:", note)

    runner = Runner(setups, tok, cfg, eos, context)
    warm = first_turn_ids(tok, "Say hello.")
    runner.hf(warm, 8, pld=False, seed=0)
    runner.hf(warm, 8, pld=True, seed=0)
    for s in setups.values():
        runner.spec(s.method, warm, 8, seed=0)
    tuned = [s for s in setups.values() if s.mode != "lookup" and s.info["budget_source"].startswith("auto")]
    tuned.sort(key=lambda s: s.mode != "drafter")
    calibration, scale = None, None
    if tuned:
        if costs and costs[1] is not None:  # an earlier run's draft cost and acceptance scale: its trees again
            draft_cost, scale, cost_source = costs[1], costs[2], args.costs_from
        elif tuned[0].mode == "drafter":  # the drafter alone on generic prompts: its cost, and its profile fitted
            calibration = calibrate(tuned[0], tok)
            draft_cost, scale, cost_source = calibration.draft_cost, calibration.acceptance_scale, "measured"
            print(
                f"calibration: tau {calibration.observed_tau:.2f} over {calibration.steps} steps where the profile "
                f"expected {calibration.expected_tau:.2f}; acceptance scaled by {scale:.3f}**depth"
            )
        else:  # fused alone: its draft cost per step (a fused engine sometimes skips drafting); its tau is lookup's too
            calib = first_turn_ids(tok, "Explain in a few sentences why the sky is blue.")
            out = runner.spec(tuned[0].method, calib, 48, seed=0)[2]
            draft_cost, cost_source = out.timings.get("draft", 0.0) / max(1, sum(map(len, out.accepted))), "measured"
        for s in tuned:
            retune_budget(s, curve, draft_cost, inf.max_budget, cost_source, acceptance_scale=scale)
            print(f"{s.mode}: budget retuned to {s.info['budget']} nodes ({s.info['budget_source']})")

    results = []
    bar = tqdm(questions, desc="evaluate", unit="prompt")
    for i, q in enumerate(bar):
        results.append(runner.run_question(q, i, ev.max_new_tokens, ev.seed))
        runs = results[-1].runs
        plain, head = runs[PLAIN], runs[headline.method]
        bar.set_postfix(domain=q.domain, speedup=f"{(head.tokens / head.time) / max(1e-9, plain.tokens / plain.time):.2f}x")

    import transformers

    setup = headline
    meta = {
        "method": setup.method,
        "checkpoint": args.checkpoint,
        "target": cfg.target.name,
        "device": str(device),
        "hardware": hardware(device),
        "dtype": str(dtype).replace("torch.", ""),
        "tree": setup.info["tree"],
        "budget": setup.info["budget"],
        "budget_source": setup.info["budget_source"],
        "budget_table": setup.info.get("budget_table"),
        "draft_cost_s": setup.info.get("draft_cost_s"),
        "accuracies": setup.info["accuracies"],
        "verify_cost": {str(k): v for k, v in curve.items()},
        "costs_from": args.costs_from,  # None: the curve and draft cost were measured in this run
        "acceptance_scale": setup.info.get("acceptance_scale"),  # None: the profile as measured
        "calibration": calibration.describe() if calibration else None,
        "acceptance": inf.acceptance,
        "lossless": inf.acceptance == "exact",
        "sampling": {"temperature": inf.temperature, "top_p": inf.top_p, "top_k": inf.sample_top_k},
        "max_new_tokens": ev.max_new_tokens,
        "questions": str(ev.questions),
        "per_domain": ev.per_domain,
        "pld_num_tokens": ev.pld_num_tokens,
        "plain_baseline": "transformers generate (same target, same process)",
        "notes": setup.info["notes"],
        "engines": {
            s.method: {k: s.info.get(k) for k in ("tree", "budget", "budget_source", "accuracies", "acceptance_scale", "notes")}
            | {"mode": s.mode}
            for s in setups.values()
        },
        "phase_times_synchronised": args.profile or device.type != "cuda",
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "created": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    depth = max(s.max_depth for s in setups.values())
    report = build_report(results, depth, meta, skipped=too_long, headline=headline.method, pld=PLD)
    write_report(report, out_dir)
    print(table(report))
    print("engine ms per verification step:")
    print(phase_table(report))
    print(f"written to {out_dir}/report.json, report.md, report.png")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
