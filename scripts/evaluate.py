"""Per-domain report: plain decoding vs speculative decoding vs HF prompt lookup, prompt by prompt.

The command-line face of `headway.inference.evaluate`: `python scripts/evaluate.py --help` lists its options.
"""

import sys

from headway.cli import run_main
from headway.inference.evaluate import main

if __name__ == "__main__":
    sys.exit(run_main(main))
