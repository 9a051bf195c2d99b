"""A/B: Medusa-1 with the heads' lm_heads frozen at the target's rows (only the residual blocks train).

    FREEZE=frozen python docs/results/2026-12-07-smollm2/avx2/medusa-ab/frozen_lm_heads.py \\
        --config configs/smollm2-135m/medusa.yaml data.output_dir=runs/ab/data \\
        train.output_dir=runs/ab/medusa-frozen train.epochs=6 train.eval_every=100 train.save_every=1000
"""
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[5]))
import headway.train.medusa as recipe  # noqa: E402
from headway.cli import run_main  # noqa: E402

build_heads = recipe.build_heads


def frozen_heads(*args, **kwargs):
    heads = build_heads(*args, **kwargs)
    if os.environ.get("FREEZE", "frozen") == "frozen":
        for head in heads.lm_heads:
            head.weight.requires_grad_(False)
    print("trainable parameters:", sum(p.numel() for p in heads.parameters() if p.requires_grad))
    return heads


recipe.build_heads = frozen_heads
sys.exit(run_main(recipe.main))
