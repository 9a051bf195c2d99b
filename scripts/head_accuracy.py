"""Per-depth top-1..top-10 accuracy of trained heads (Medusa, EAGLE-1, EAGLE-3) on the validation split: the tree profile.

The command-line face of `headway.inference.head_accuracy`: `python scripts/head_accuracy.py --help` lists its options.
"""

import sys

from headway.cli import run_main
from headway.inference.head_accuracy import main

if __name__ == "__main__":
    sys.exit(run_main(main))
