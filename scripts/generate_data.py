"""Self-distilled training data: the target answers the prompt mix of a data config.

    python scripts/generate_data.py --config configs/smollm2-135m/data.yaml
    python scripts/generate_data.py --config configs/smollm2-135m/data.yaml data.max_prompts_per_source=16
    accelerate launch --config_file configs/accelerate/multi_gpu.yaml scripts/generate_data.py --config ...

Interrupt it at any time: a rerun with the same settings resumes from the finished shards.
"""

import argparse
import sys

from headway.cli import run_main
from headway.config import load_config
from headway.data.distill import distill


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True)
    ap.add_argument("overrides", nargs="*", help="section.key=value")
    args = ap.parse_intermixed_args(argv)
    distill(load_config(args.config, args.overrides))
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
