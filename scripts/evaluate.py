"""Per-domain report: plain decoding vs speculative decoding vs HF prompt lookup, prompt by prompt.

    python scripts/evaluate.py --config configs/smollm2-135m/medusa.yaml --checkpoint runs/smollm2-135m/medusa
    python scripts/evaluate.py --config configs/smollm2-135m/eagle3.yaml --checkpoint DIR --per-domain 10 \\
        --max-new-tokens 128 --out runs/eval/eagle3
    python scripts/evaluate.py --config configs/smollm2-135m/medusa.yaml --per-domain 2 --max-new-tokens 32  # smoke: untrained heads
    python scripts/evaluate.py --config configs/smollm2-135m/medusa.yaml --layer-skip 8   # self-speculation baseline

Questions default to Spec-Bench (six domains); `--questions FILE` takes any JSONL in its format.
For every prompt (and every turn of a multi-turn one, each method continuing its own answers) the
three methods run back to back in one process, in an order that rotates per prompt, so machine
drift hits all three alike. Writes report.json / report.md / report.png to --out and prints the
table. Extra `section.key=value` arguments override the recipe (e.g. inference.tree_budget=32).
"""

import sys

from headway.inference.evaluate import main

if __name__ == "__main__":
    sys.exit(main())
