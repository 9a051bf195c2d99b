"""Build the target-feature cache of an offline recipe (Medusa or EAGLE), so training runs no target forward.

The command-line face of `headway.train.cache_features`: `python scripts/cache_features.py --help` lists its options.
"""

import sys

from headway.cli import run_main
from headway.train.cache_features import main

if __name__ == "__main__":
    sys.exit(run_main(main))
