"""Prepare a target checkpoint offline and print its folder (last line).

    python scripts/prepare_target.py                         # the built-in SmolLM2-135M-Instruct
    python scripts/prepare_target.py --config configs/smollm2-135m/data.yaml
    HEADWAY_CACHE=/big/disk python scripts/prepare_target.py --force

Idempotent: a second run finds the finished folder and returns at once.
"""

import argparse
import sys

from headway.cli import run_main
from headway.config import load_config
from headway.target import BUILTIN_TARGETS, prepare_builtin


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--name", default=None, help=f"built-in target: {', '.join(BUILTIN_TARGETS)}")
    ap.add_argument("--config", default=None, help="take target.name from this YAML")
    ap.add_argument("--force", action="store_true", help="rebuild even if the folder exists")
    args = ap.parse_args(argv)
    name = args.name or (load_config(args.config).target.name if args.config else "smollm2-135m-instruct")
    if name not in BUILTIN_TARGETS:
        # Hub ids and local folders need no preparation: transformers loads them directly.
        print(name)
        return 0
    folder = prepare_builtin(name, force=args.force, log=lambda m: print(m, file=sys.stderr))
    print(folder)
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
