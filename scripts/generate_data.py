"""Self-distilled training data: the target answers the prompt mix of a data config.

    python scripts/generate_data.py --config configs/smollm2-135m/data.yaml
    python scripts/generate_data.py --config configs/smollm2-135m/data.yaml data.max_prompts_per_source=16
    accelerate launch --config_file configs/accelerate/multi_gpu.yaml scripts/generate_data.py --config ...

Interrupt it at any time: a rerun with the same settings resumes from the finished shards. Shards are
answered in a shuffled order, so the finished ones mix every domain: `--partial` assembles them into a
dataset the recipes can train on now (its summary says how many shards it holds); a later run without
it finishes the rest and assembles everything.

    python scripts/generate_data.py --config configs/smollm2-135m/data.yaml --partial
"""

import argparse
import sys

from headway.cli import run_main
from headway.config import load_config
from headway.data.distill import distill


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True)
    ap.add_argument("--partial", action="store_true", help="generate nothing: assemble the shards finished so far")
    ap.add_argument("overrides", nargs="*", help="section.key=value")
    args = ap.parse_intermixed_args(argv)
    distill(load_config(args.config, args.overrides), partial=args.partial)
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
