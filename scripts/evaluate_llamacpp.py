"""Per-domain report of llama.cpp: plain, n-gram speculation, the headway EAGLE-3 drafter, drafter + n-gram.

    python scripts/export.py --checkpoint runs/smollm2-135m/eagle3 --to llamacpp --out exports/smollm2-eagle3-llamacpp
    python scripts/evaluate_llamacpp.py --export exports/smollm2-eagle3-llamacpp --per-domain 10 --max-new-tokens 128
    python scripts/evaluate_llamacpp.py --export DIR --per-domain 1 --max-new-tokens 16 --out runs/eval/llamacpp-smoke
    python scripts/evaluate_llamacpp.py --export DIR --p-min 0 --variants 1:0.4,2:0.6 --ngram ngram-mod --combo-ngram ngram-mod

Configurations (inference/llamacpp_eval.py): plain decoding with every target GGUF of the export (f16:
headway's exact greedy output; the shipped Q4_1: the fastest plain choice), the drafter with each of
them, llama.cpp's n-gram speculation types (--ngram) and the drafter combined with n-gram types
(--combo-ngram), all with --primary as target, and the drafter with other draft settings (--variants; its
own are the export's --draft-n-max / --draft-p-min unless --n-max / --p-min are given). Spec-Bench by
default; every prompt runs through every configuration back to back, the order rotated per prompt; one llama-server per configuration, at
--threads threads (one by default: on a CPU other processes share, two threads stall). Writes
report.json / report.md / report.png in scripts/evaluate.py's format (plain = llama.cpp plain with the
primary target, spec = the drafter, PLD = the fastest n-gram type) plus every configuration, and the
ceiling that llama-bench's verify-cost curve and the drafter's measured acceptance allow.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

from tqdm.auto import tqdm

from headway.cli import run_main
from headway.config import TargetConfig
from headway.data.chat import first_turn_ids
from headway.export.serve import FLASH_ATTN
from headway.inference.llamacpp_ceiling import verify_cost
from headway.inference.llamacpp_eval import (
    NGRAM_TYPES,
    DraftSettings,
    LlamaRunner,
    configs_for,
    draft_settings,
    eos_ids,
    flash_attn_setting,
    read_manifest,
)
from headway.inference.llamacpp_report import llamacpp_markdown, llamacpp_report
from headway.inference.questions import load_questions, skip_long_questions
from headway.inference.report import markdown, table, write_report
from headway.llamacpp import ensure_llamacpp
from headway.paths import resolve_path
from headway.target import load_tokenizer

SPEC_BENCH = "data/prompts/spec_bench/question.jsonl"
RECORDS = "records.jsonl"


def _names(text: str) -> tuple[str, ...]:
    return tuple(t.strip() for t in text.split(",") if t.strip())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--export", required=True, help="a folder written by scripts/export.py --to llamacpp")
    p.add_argument("--questions", default=SPEC_BENCH, help="Spec-Bench-format JSONL")
    p.add_argument("--per-domain", type=int, default=10, help="questions per domain")
    p.add_argument("--max-new-tokens", type=int, default=128, help="per turn")
    p.add_argument("--threads", type=int, default=1, help="llama.cpp threads per server")
    p.add_argument(
        "--primary", default="f16", help="the target GGUF of the n-gram and combined configurations"
    )
    p.add_argument(
        "--ngram", default=",".join(NGRAM_TYPES), help="n-gram types to run alone (comma-separated)"
    )
    p.add_argument(
        "--combo-ngram", default="ngram-simple,ngram-mod", help="n-gram types to combine with the drafter"
    )
    p.add_argument("--n-max", type=int, help="draft tokens per step (default: the export's)")
    p.add_argument(
        "--p-min", type=float, help="cut drafts at a token under this draft probability (default: the export's)"
    )
    p.add_argument(
        "--variants",
        default="",
        help="further drafter configurations on the primary target, N or N:P each (draft tokens, p-min), "
        "comma-separated, e.g. 1,2:0.6",
    )
    p.add_argument(
        "--flash-attn",
        choices=FLASH_ATTN,
        help="every server's and llama-bench's -fa (default: the export's serve command's; older exports: auto)",
    )
    p.add_argument("--no-ceiling", action="store_true", help="skip llama-bench's verify-cost curve")
    p.add_argument("--out", help="output folder (default: EXPORT/eval)")
    args = p.parse_args(argv)
    if args.per_domain < 1 or args.max_new_tokens < 1 or args.threads < 1:
        p.error("--per-domain, --max-new-tokens and --threads must be at least 1")

    folder = Path(args.export)
    manifest = read_manifest(folder)
    try:
        variants = tuple(DraftSettings.parse(v) for v in _names(args.variants))
        own = draft_settings(manifest, args.n_max, args.p_min)
    except ValueError as e:
        p.error(str(e))
    flash_attn = flash_attn_setting(manifest, args.flash_attn)
    configs = configs_for(
        folder, args.primary, _names(args.ngram), _names(args.combo_ngram), own.n_max, p_min=own.p_min,
        variants=variants, flash_attn=flash_attn,
    )
    n_max = own.n_max
    target_dir = Path(manifest["target_folder"])
    tok = load_tokenizer(
        TargetConfig(name=manifest["target"] if not target_dir.is_dir() else str(target_dir))
    )
    context = json.loads((target_dir / "config.json").read_text()).get("max_position_embeddings", 4096)
    questions = load_questions(resolve_path(args.questions), args.per_domain)
    questions, too_long = skip_long_questions(
        questions, lambda q: len(first_turn_ids(tok, q.turns[0])), 2 * args.max_new_tokens, context
    )
    if too_long:
        print(f"skipped {sum(too_long.values())} questions beyond the context of {context}: {dict(too_long)}")

    llama = ensure_llamacpp(log=lambda m: print(m, file=sys.stderr))
    primary_gguf = folder / manifest["targets"][args.primary]
    curve = {}
    if not args.no_ceiling:
        print(
            f"measuring llama.cpp's verify cost on {primary_gguf.name} (llama-bench, {args.threads} thread(s))"
        )
        curve = verify_cost(llama, primary_gguf, args.threads, flash_attn=flash_attn)
    print("configurations: " + ", ".join(c.name for c in configs))
    records = []
    with LlamaRunner(llama, folder, configs, tok, eos_ids(target_dir, tok), args.threads, context) as runner:
        runner.warm_up(first_turn_ids(tok, "Say hello."))
        for i, q in enumerate(tqdm(questions, desc="evaluate", unit="question")):
            records += runner.run_question(q, i, args.max_new_tokens)

    meta = {
        "method": "eagle3 in llama.cpp",
        "checkpoint": manifest.get("checkpoint"),
        "export": str(folder),
        "target": manifest["target"],
        "device": f"cpu (llama.cpp {llama.version}, {args.threads} thread(s) per server)",
        "dtype": f"target GGUF {args.primary}, draft GGUF {manifest['draft_outtype']}",
        "tree": {"kind": "chain", "depth": n_max},
        "budget": n_max,
        "budget_source": "--spec-draft-n-max",
        "p_min": own.p_min,
        "flash_attn": flash_attn or "auto (llama.cpp's default)",
        "acceptance": "exact",
        "lossless": True,
        "sampling": {"temperature": 0.0},
        "max_new_tokens": args.max_new_tokens,
        "questions": str(args.questions),
        "per_domain": args.per_domain,
        "plain_baseline": f"llama.cpp plain with target GGUF {args.primary} (same servers, same prompts)",
        "timing": "llama.cpp's decode time (predicted_ms), prefill excluded; end-to-end in llamacpp.configs",
        "created": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    out = Path(args.out or folder / "eval")
    out.mkdir(parents=True, exist_ok=True)
    with open(out / RECORDS, "w") as f:  # every turn of every configuration, to re-read the report's sums
        f.writelines(json.dumps(asdict(r)) + "\n" for r in records)
    (out / "verify_cost.json").write_text(json.dumps({str(k): v for k, v in curve.items()}) + "\n")
    report = llamacpp_report(records, configs, meta, curve, args.primary, n_max)
    write_report(report, out)
    section = llamacpp_markdown(report)
    (out / "report.md").write_text(markdown(report) + section)
    print(table(report))
    print(section)
    print(f"written to {out}/report.json, report.md, report.png")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
